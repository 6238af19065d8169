// Generic SDPA kernels for __nv_bfloat16, head sizes up to 128.
#include "cuda/sdpa_generic.cuh"

ATTNLAB_INSTANTIATE_SDPA_GENERIC(__nv_bfloat16, 128)
