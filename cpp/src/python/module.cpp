// attnlab._C: loading it loads libattnlab, whose static initializers register the
// torch.ops.attnlab operators. The operators are called through torch.ops, not through here.
#include <pybind11/pybind11.h>

#include "attnlab/build_info.h"

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
    return d;
  });
}
