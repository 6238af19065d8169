#include "attnlab/build_info.h"

#include <dlfcn.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <ATen/Parallel.h>

#include "cpu/gemm/gemm.h"
#include "cpu/isa/isa.h"

namespace attnlab {

BuildInfo build_info() {
  BuildInfo info;
  info.version = ATTNLAB_VERSION;
  info.torch_version = ATTNLAB_TORCH_VERSION;
#ifdef ATTNLAB_WITH_CUDA
  info.cuda = true;
#endif
  info.cuda_archs = ATTNLAB_CUDA_ARCHS;
#ifdef _OPENMP
  info.openmp = true;
#endif
  return info;
}

// The route bfloat16 attention takes: the bfloat16 GEMM's where its products pay, else float32.
std::string cpu_bf16_products() {
  return cpu::bf16_products_pay() ? cpu::bf16_products() : "float32";
}

std::string cpu_float32_products() { return cpu::f32_gemm_available() ? "avx512" : "blas"; }

std::string cpu_vector_kernels() {
  if (cpu::has_avx512_core()) return "avx512";
  return cpu::avx2_without_avx512() ? "avx2" : "generic";
}

std::string cpu_clone_targets() { return ATTNLAB_CPU_CLONE_TARGETS; }

double cpu_bf16_product_speedup() { return cpu::bf16_product_speedup(); }

namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// "2.15.0" of "2.15.0+cu132", "2.16.0.dev20260101" or "2.15.0a0+git123"; empty if none.
// Parsed by hand, not with std::regex: this runs while the library is being loaded, and
// compiling a std::regex there crashed (SIGSEGV inside libstdc++'s regex/locale code) on a
// GPU machine whose build used GCC 13.3 from /opt/gcc, while the same sources built with
// Debian's GCC 12 loaded there.
std::string release_of(const std::string& version) {
  size_t at = 0;
  while (at < version.size() && std::isspace(static_cast<unsigned char>(version[at]))) ++at;
  const size_t start = at;
  for (int part = 0; part < 3; ++part) {
    if (part > 0) {
      if (at >= version.size() || version[at] != '.') return "";
      ++at;
    }
    const size_t digits = at;
    while (at < version.size() && std::isdigit(static_cast<unsigned char>(version[at]))) ++at;
    if (at == digits) return "";
  }
  return version.substr(start, at - start);
}

// The quoted value of the first `__version__ = '...'` (or "...") line of torch/version.py.
std::string version_assignment(const std::string& text) {
  const std::string name = "__version__";
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    size_t i = at + name.size();
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (i >= text.size() || text[i] != '=') continue;
    ++i;
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    if (i >= text.size() || (text[i] != '\'' && text[i] != '"')) continue;
    const char quote = text[i];
    const size_t end = text.find(quote, i + 1);
    if (end == std::string::npos) return "";
    return text.substr(i + 1, end - i - 1);
  }
  return "";
}

}  // namespace

std::string loaded_torch_version() {
  Dl_info where{};
  // A function defined in libtorch_cpu: its address lies in the library the loader chose.
  if (dladdr(reinterpret_cast<void*>(&at::get_num_threads), &where) == 0 ||
      where.dli_fname == nullptr)
    return "";
  std::error_code error;
  const auto lib_dir = std::filesystem::path(where.dli_fname).parent_path();
  const auto root = lib_dir.parent_path();
  // pip: site-packages/torch/{lib/libtorch_cpu.so, version.py}
  const auto version_py = root / "version.py";
  if (std::filesystem::exists(version_py, error)) {
    const std::string version = version_assignment(read_file(version_py));
    if (!version.empty()) return version;
  }
  // LibTorch archive: libtorch/{lib/libtorch_cpu.so, build-version}
  const auto build_version = root / "build-version";
  if (std::filesystem::exists(build_version, error)) {
    std::string text = read_file(build_version);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    return text;
  }
  return "";
}

bool torch_versions_compatible(const std::string& built, const std::string& loaded) {
  if (loaded.empty()) return true;
  return release_of(built) == release_of(loaded);
}

std::string torch_version_problem() {
  const std::string built = ATTNLAB_TORCH_VERSION;
  const std::string loaded = loaded_torch_version();
  if (torch_versions_compatible(built, loaded)) return "";
  return "attnlab " ATTNLAB_VERSION " was built against torch " + built +
         " but this process loaded torch " + loaded +
         "; rebuild attnlab against this torch (pip install --no-build-isolation "
         "--force-reinstall --no-deps <attnlab source folder>) or use torch " +
         release_of(built);
}

namespace {
// Checked when libattnlab is loaded, by a C++ program or by Python: a mismatch is named at
// once, before an operator fails in some less readable way.
[[maybe_unused]] const bool kTorchChecked = [] {
  const std::string problem = torch_version_problem();
  if (!problem.empty()) std::cerr << problem << std::endl;
  return problem.empty();
}();
}  // namespace

}  // namespace attnlab
