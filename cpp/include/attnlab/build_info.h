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

}  // namespace attnlab
