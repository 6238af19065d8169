#pragma once
#include <string>

namespace attnlab {

struct BuildInfo {
  std::string version;        // attnlab
  std::string torch_version;  // the torch the library was compiled against
  bool cuda = false;          // CUDA kernels compiled in
  std::string cuda_archs;     // comma-separated SM architectures, empty without CUDA
  bool openmp = false;        // CPU kernels run their at::parallel_for loops on torch's threads
};

BuildInfo build_info();

// Where this CPU runs the products of bfloat16 attention, decided at run time: "amx" (AMX-BF16
// tiles through torch's oneDNN brgemm; off with ATTNLAB_CPU_BRGEMM=0), "onednn_brgemm" (the same
// route without AMX, only with ATTNLAB_CPU_BRGEMM=1), "avx512_bf16" (vdpbf16ps, where it does
// the products faster than float32 FMAs: cpu_bf16_product_speedup) or "float32" (widened: no
// AVX512-BF16, or vdpbf16ps no faster). ATTNLAB_CPU_BF16_PRODUCTS=1 or 0 forces bfloat16
// products on (where the CPU has AVX512-BF16) or off.
std::string cpu_bf16_products();

// Where this CPU runs float32 products, decided at run time: "avx512" (attnlab's own GEMM, on
// CPUs with AVX-512 F/BW/VL/DQ; a row's or column's result then does not depend on how a product
// is split into blocks or among threads) or "blas" (the BLAS torch links).
std::string cpu_float32_products();

// The code the small-shape kernels and the softmax's row passes run on this CPU: "avx512",
// "avx2" (CPUs with AVX2 and FMA but no AVX-512, or ATTNLAB_CPU_ISA=avx2 in the environment,
// which also sends float32 products to the BLAS) or "generic".
std::string cpu_vector_kernels();

// The instruction sets the library's multi-versioned kernels were compiled for, picked among
// at load time: "x86-64-v4,x86-64-v3,default", or "x86-64-v3,default" in a build with the CMake
// option ATTNLAB_CPU_AVX2_ONLY (as an AVX2-only CPU runs it; cpu_vector_kernels() is then
// "avx2" or "generic"); empty off x86-64 or GCC.
std::string cpu_clone_targets();

// The multiply-add rate of vdpbf16ps over that of float32 FMAs on this CPU, measured once by a
// register-only probe (0 without AVX512-BF16): about 2 on an AMD Zen 4, 0.5 on an Intel Xeon
// (Emerald Rapids).
double cpu_bf16_product_speedup();

// The version of the torch library this process has loaded ("2.15.0+cpu"), read from the
// folder that libtorch_cpu was loaded from (a pip install's torch/version.py or a LibTorch
// archive's build-version file); empty when neither is there.
std::string loaded_torch_version();

// Whether a library compiled against torch `built` can run with torch `loaded`: the same
// release (major.minor.patch; local suffixes such as +cpu or +cu132 aside). An empty `loaded`
// (unknown) counts as compatible.
bool torch_versions_compatible(const std::string& built, const std::string& loaded);

// Empty when the loaded torch is compatible with the one attnlab was compiled against;
// otherwise a one-line message naming both versions and how to rebuild. libattnlab prints it
// to stderr once when it is loaded.
std::string torch_version_problem();

}  // namespace attnlab
