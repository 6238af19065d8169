// FlashAttention-2-style tensor-core SDPA forward for __nv_bfloat16, head size 64.
#include "cuda/sdpa_flash.cuh"

ATTNLAB_INSTANTIATE_SDPA_FLASH(__nv_bfloat16, 64)
