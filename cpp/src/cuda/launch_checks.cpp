#include "cuda/launch_checks.h"

#include <limits>

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>

namespace attnlab::cuda {

void check_grid_size(int64_t blocks) {
  TORCH_CHECK(blocks <= std::numeric_limits<int>::max(), "attnlab: the problem needs ", blocks,
              " CUDA blocks, more than one grid holds");
}

void check_cuda_call(cudaError_t status) { C10_CUDA_CHECK(status); }

void check_kernel_launch() { C10_CUDA_KERNEL_LAUNCH_CHECK(); }

}  // namespace attnlab::cuda
