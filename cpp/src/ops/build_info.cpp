#include "attnlab/build_info.h"

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

}  // namespace attnlab
