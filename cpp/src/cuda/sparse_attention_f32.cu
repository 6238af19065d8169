// Sparse attention kernels for float, every head-size family (up to 256 features).
#include "cuda/sparse_attention.cuh"

ATTNLAB_INSTANTIATE_SPARSE(float, 32)
ATTNLAB_INSTANTIATE_SPARSE(float, 64)
ATTNLAB_INSTANTIATE_SPARSE(float, 128)
ATTNLAB_INSTANTIATE_SPARSE(float, 256)
