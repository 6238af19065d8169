// Sparse attention kernels for __half, every head-size family (up to 256 features).
#include "cuda/sparse_attention.cuh"

ATTNLAB_INSTANTIATE_SPARSE(__half, 32)
ATTNLAB_INSTANTIATE_SPARSE(__half, 64)
ATTNLAB_INSTANTIATE_SPARSE(__half, 128)
ATTNLAB_INSTANTIATE_SPARSE(__half, 256)
