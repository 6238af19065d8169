// Generic SDPA kernels for float, head sizes up to 32.
#include "cuda/sdpa_generic.cuh"

ATTNLAB_INSTANTIATE_SDPA_GENERIC(float, 32)
