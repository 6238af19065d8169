// FlashAttention-2-style tensor-core SDPA forward for __half, head size 64.
#include "cuda/sdpa_flash.cuh"

ATTNLAB_INSTANTIATE_SDPA_FLASH(__half, 64)
