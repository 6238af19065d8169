// The float small attention kernels (small_attention_impl.h) in 32-byte vectors, for CPUs with
// AVX2 and FMA but not AVX-512: comparisons, selects and the transposes' shuffles on 8 lanes
// are single AVX2 instructions. The functions are compiled for AVX2 by attribute, not by a
// file-wide -mavx2, so that the inline library code this file emits stays baseline x86-64.
#define ATTNLAB_VECTOR_BYTES 32

#include "cpu/attention/small_attention.h"
#include "cpu/attention/small_attention_impl.h"

namespace attnlab::cpu::avx2 {

ATTNLAB_SMALL_ATTENTION_FLOAT_KERNELS(ATTNLAB_AVX2_TARGET, small_attention_rows,
                                      small_attention_backward)

}  // namespace attnlab::cpu::avx2
