// Tensor-core SDPA forward for __half, head size 64.
#include "cuda/sdpa_tensor_core.cuh"

ATTNLAB_INSTANTIATE_SDPA_TENSOR_CORE(__half, 64)
