// Generic SDPA kernels for __half, head sizes up to 64.
#include "cuda/sdpa_generic.cuh"

ATTNLAB_INSTANTIATE_SDPA_GENERIC(__half, 64)
