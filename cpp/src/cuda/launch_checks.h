#pragma once
// Error checks for the kernel launches in the .cu files. They are defined in a host translation
// unit (launch_checks.cpp, with torch's C10_CUDA_* macros) so that the .cu files include no
// torch headers, which halves their compile time.

#include <cstdint>

#include <cuda_runtime_api.h>

namespace attnlab::cuda {

// Throws unless `blocks` fits in a one-dimensional grid.
void check_grid_size(int64_t blocks);

// C10_CUDA_CHECK(status): throws a c10::Error naming the CUDA error.
void check_cuda_call(cudaError_t status);

// C10_CUDA_KERNEL_LAUNCH_CHECK(): throws if the last kernel launch failed.
void check_kernel_launch();

}  // namespace attnlab::cuda
