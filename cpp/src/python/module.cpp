// attnlab._C: loading it loads libattnlab, whose static initializers register the
// torch.ops.attnlab operators. The operators are called through torch.ops, not through here.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "attnlab/build_info.h"
#include "attnlab/cpu_gemm.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "attnlab native core";
  m.def("build_info", [] {
    const auto info = attnlab::build_info();
    py::dict d;
    d["version"] = info.version;
    d["torch"] = info.torch_version;
    d["cuda"] = info.cuda;
    py::list archs;
    size_t start = 0;
    while (start < info.cuda_archs.size()) {
      size_t comma = info.cuda_archs.find(',', start);
      if (comma == std::string::npos) comma = info.cuda_archs.size();
      archs.append(info.cuda_archs.substr(start, comma - start));
      start = comma + 1;
    }
    d["cuda_archs"] = archs;
    d["openmp"] = info.openmp;
    d["torch_loaded"] = attnlab::loaded_torch_version();
    d["cpu_bf16_products"] = attnlab::cpu_bf16_products();
    d["cpu_bf16_product_speedup"] = attnlab::cpu_bf16_product_speedup();
    d["cpu_float32_products"] = attnlab::cpu_float32_products();
    d["cpu_vector_kernels"] = attnlab::cpu_vector_kernels();
    d["cpu_clone_targets"] = attnlab::cpu_clone_targets();
    return d;
  });
  m.def("_float32_fma_peak", [](double seconds) {
    py::gil_scoped_release release;
    return attnlab::cpu_float32_fma_peak(seconds);
  });
  // attnlab._gemm.float32_mm's native half: raw addresses, checked on the Python side (this
  // module does not link torch's Python bindings).
  m.def("_float32_gemm", [](bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            uintptr_t a, int64_t lda, uintptr_t b, int64_t ldb, uintptr_t c,
                            int64_t ldc) {
    py::gil_scoped_release release;
    attnlab::cpu_float32_gemm(trans_a, trans_b, m, n, k, reinterpret_cast<const float*>(a), lda,
                              reinterpret_cast<const float*>(b), ldb, reinterpret_cast<float*>(c),
                              ldc);
  });
}
