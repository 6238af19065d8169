// Tensor-core SDPA forward for __nv_bfloat16, head size 128.
#include "cuda/sdpa_tensor_core.cuh"

ATTNLAB_INSTANTIATE_SDPA_TENSOR_CORE(__nv_bfloat16, 128)
