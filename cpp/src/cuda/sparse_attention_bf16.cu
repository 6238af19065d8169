// Sparse attention kernels for __nv_bfloat16, every head-size family (up to 256 features).
#include "cuda/sparse_attention.cuh"

ATTNLAB_INSTANTIATE_SPARSE(__nv_bfloat16, 32)
ATTNLAB_INSTANTIATE_SPARSE(__nv_bfloat16, 64)
ATTNLAB_INSTANTIATE_SPARSE(__nv_bfloat16, 128)
ATTNLAB_INSTANTIATE_SPARSE(__nv_bfloat16, 256)
