#include "cpu/encoder_block_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include <ATen/Parallel.h>

#include "cpu/blas.h"
#include "cpu/isa.h"

namespace attnlab::cpu {
namespace {

template <typename T>
std::unique_ptr<T[]> scratch(int64_t n) {
  return std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n));
}

constexpr int64_t kKeptScratchBytes = int64_t(64) << 20;

// Scratch memory for one chunk, carved from a block that each thread keeps between calls (up
// to kKeptScratchBytes): allocating and freeing megabytes per call let the allocator hand the
// pages back to the kernel and fault them in again, ~200 page faults per reversal-shape layer.
// Slot tells apart blocks that are alive at the same time on one thread.
template <typename T, int Slot = 0>
class ChunkScratch {
 public:
  explicit ChunkScratch(int64_t elements) {
    thread_local std::unique_ptr<T[]> kept;
    thread_local int64_t kept_elements = 0;
    if (elements * static_cast<int64_t>(sizeof(T)) > kKeptScratchBytes) {
      owned_ = scratch<T>(elements);
      next_ = owned_.get();
      return;
    }
    if (kept_elements < elements) {
      kept = scratch<T>(elements);
      kept_elements = elements;
    }
    next_ = kept.get();
  }
  T* take(int64_t elements) {
    T* taken = next_;
    next_ += elements;
    return taken;
  }

 private:
  std::unique_ptr<T[]> owned_;
  T* next_ = nullptr;
};

// Y[rows, out] = X[rows, in]·Wᵀ + bias, W [out, in].
template <typename T>
void linear(int64_t rows, int64_t in, int64_t out, const T* x, const T* weight, const T* bias,
            T* y) {
  for (int64_t r = 0; r < rows; ++r) std::copy(bias, bias + out, y + r * out);
  gemm(false, true, rows, out, in, T(1), x, in, weight, in, T(1), y, out);
}

// out[c] = Σ_r x[r, c].
template <typename T>
ATTNLAB_ISA_CLONES void column_sums(int64_t rows, int64_t cols, const T* x, T* out) {
  std::fill(out, out + cols, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

// For Y = X·Wᵀ + b: dW = dYᵀ·X, db = Σ_rows dY, and dX = dY·W (+ dX when accumulate), unless
// grad_x is null.
template <typename T>
void linear_backward(int64_t rows, int64_t in, int64_t out, const T* grad_y, const T* x,
                     const T* weight, T* grad_x, bool accumulate, T* grad_weight, T* grad_bias) {
  gemm(true, false, out, in, rows, T(1), grad_y, out, x, in, T(0), grad_weight, in);
  column_sums(rows, out, grad_y, grad_bias);
  if (grad_x) {
    gemm(false, false, rows, in, out, T(1), grad_y, out, weight, in, accumulate ? T(1) : T(0),
         grad_x, in);
  }
}

// LayerNorm of the rows v = a + b + bias (b and bias both given or both null): xhat = (v − mean)·rstd,
// out = xhat·weight + shift. sum_out, when not null, receives v itself. v is built in xhat.
template <typename T>
ATTNLAB_ISA_CLONES void layer_norm_rows(int64_t rows, int64_t cols, const T* a, const T* b,
                                        const T* bias, const T* weight, const T* shift, T eps,
                                        T* sum_out, T* xhat, T* rstd, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * cols;
    T* xr = xhat + r * cols;
    if (b && bias) {
      const T* br = b + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) xr[c] = ar[c] + br[c] + bias[c];
    } else {
      std::copy(ar, ar + cols, xr);
    }
    if (sum_out) std::copy(xr, xr + cols, sum_out + r * cols);
    T mean = 0;
#pragma omp simd reduction(+ : mean)
    for (int64_t c = 0; c < cols; ++c) mean += xr[c];
    mean /= cols;
    T var = 0;
#pragma omp simd reduction(+ : var)
    for (int64_t c = 0; c < cols; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    const T inv = T(1) / std::sqrt(var / cols + eps);
    rstd[r] = inv;
    T* outr = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      xr[c] = (xr[c] - mean) * inv;
      outr[c] = xr[c] * weight[c] + shift[c];
    }
  }
}

// LayerNorm backward from dout = ∂L/∂out: with g = dout·weight,
// dv = rstd·(g − mean(g) − xhat·mean(g·xhat)), written to grad_in, or added to it when
// accumulate; grad_weight = Σ dout·xhat, grad_shift = Σ dout. grad_in may alias dout.
template <typename T>
ATTNLAB_ISA_CLONES void layer_norm_backward_rows(int64_t rows, int64_t cols, const T* dout,
                                                 const T* xhat, const T* rstd, const T* weight,
                                                 T* grad_in, bool accumulate, T* grad_weight,
                                                 T* grad_shift) {
  std::fill(grad_weight, grad_weight + cols, T(0));
  std::fill(grad_shift, grad_shift + cols, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* dr = dout + r * cols;
    const T* xr = xhat + r * cols;
    T g_sum = 0, gx_sum = 0;
#pragma omp simd reduction(+ : g_sum, gx_sum)
    for (int64_t c = 0; c < cols; ++c) {
      const T g = dr[c] * weight[c];
      g_sum += g;
      gx_sum += g * xr[c];
      grad_weight[c] += dr[c] * xr[c];
      grad_shift[c] += dr[c];
    }
    const T g_mean = g_sum / cols, gx_mean = gx_sum / cols, inv = rstd[r];
    T* gr = grad_in + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      const T d = inv * (dr[c] * weight[c] - g_mean - xr[c] * gx_mean);
      gr[c] = accumulate ? gr[c] + d : d;
    }
  }
}

template <typename T>
ATTNLAB_ISA_CLONES void relu_in_place(int64_t n, T* x) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] > T(0) ? x[i] : T(0);
}

// grad *= (relu_out > 0)
template <typename T>
ATTNLAB_ISA_CLONES void relu_backward_in_place(int64_t n, const T* relu_out, T* grad) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) grad[i] = relu_out[i] > T(0) ? grad[i] : T(0);
}

// out = a + b + bias (rows of cols), any of b, bias may be null.
template <typename T>
ATTNLAB_ISA_CLONES void add_rows(int64_t rows, int64_t cols, const T* a, const T* b,
                                 const T* bias, T* out) {
  for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] = a[r * cols + c] + (b ? b[r * cols + c] : T(0)) + (bias ? bias[c] : T(0));
    }
  }
}

// total[j] += Σ_c partials[c·stride + j] for j < n, c < count.
template <typename T>
ATTNLAB_ISA_CLONES void add_partials(int64_t n, int64_t count, int64_t stride, const T* partials,
                                     T* total) {
  for (int64_t c = 0; c < count; ++c) {
    const T* part = partials + c * stride;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) total[j] += part[j];
  }
}

// Views of the forward's activations buffer (layout in the header).
template <typename T>
struct Activations {
  T *qkv, *attention, *xhat1, *norm1_out, *xhat2, *norm2_out, *relu_out, *rstd1, *rstd2, *lse;
  Activations(const EncoderBlockShape& s, T* base) {
    const int64_t n = s.tokens(), e = s.dim;
    qkv = base;
    attention = qkv + n * 3 * e;
    xhat1 = attention + n * e;
    norm1_out = xhat1 + n * e;
    xhat2 = norm1_out + n * e;
    norm2_out = xhat2 + n * e;
    relu_out = norm2_out + n * e;
    rstd1 = relu_out + n * s.dim_ff;
    rstd2 = rstd1 + n;
    lse = rstd2 + n;
  }
  // The same views moved to the rows of batch entries from b0 on.
  Activations from_batch(const EncoderBlockShape& s, int64_t b0) const {
    Activations a = *this;
    const int64_t r0 = b0 * s.length, e = s.dim;
    a.qkv += r0 * 3 * e;
    for (T** view : {&a.attention, &a.xhat1, &a.norm1_out, &a.xhat2, &a.norm2_out}) *view += r0 * e;
    a.relu_out += r0 * s.dim_ff;
    a.rstd1 += r0;
    a.rstd2 += r0;
    a.lse += b0 * s.heads * s.length;
    return a;
  }
};

// Attention over the heads of a [N, 3E] qkv buffer laid out per head as [q_h | k_h | v_h]: each
// (batch, head) entry reads its rows in place, at row stride 3E.
template <typename T>
struct HeadsProblem {
  AttentionProblem<T> problem;
  std::vector<int64_t> q_offsets, k_offsets, v_offsets;

  HeadsProblem(const EncoderBlockShape& s, const T* qkv, const BatchedRows<T>& mask) {
    const int64_t hd = s.head_dim(), entries = s.batch * s.heads;
    q_offsets.resize(entries);
    k_offsets.resize(entries);
    v_offsets.resize(entries);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t i = b * s.heads + h, base = b * s.length * 3 * s.dim + h * 3 * hd;
        q_offsets[i] = base;
        k_offsets[i] = base + hd;
        v_offsets[i] = base + 2 * hd;
      }
    }
    auto& p = problem;
    p.batch = entries;
    p.len_q = p.len_k = s.length;
    p.dim_qk = p.dim_v = hd;
    p.scale = T(1) / std::sqrt(static_cast<T>(hd));
    p.query = {qkv, q_offsets.data(), 3 * s.dim};
    p.key = {qkv, k_offsets.data(), 3 * s.dim};
    p.value = {qkv, v_offsets.data(), 3 * s.dim};
    p.mask = mask;
  }
};

// Calls f(head_row, token_row) for every row of every head: the element offsets of that row in
// the heads-apart layout [B·H, L, hd] and in a heads-side-by-side layout whose token rows are
// token_stride apart and whose heads are head_stride apart ([B·L, E]: E and hd; the qkv
// buffer [B·L, 3E]: 3E and 3·hd).
template <typename F>
void for_each_head_row(const EncoderBlockShape& s, int64_t token_stride, int64_t head_stride,
                       F f) {
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t l = 0; l < s.length; ++l) {
        f(((b * s.heads + h) * s.length + l) * s.head_dim(),
          (b * s.length + l) * token_stride + h * head_stride);
      }
    }
  }
}

// The block on the batch entries of s, which share one thread and run their GEMMs
// sequentially.
template <typename T>
void forward_chunk(const EncoderBlockShape& s, const T* x, const EncoderBlockParams<T>& p,
                   const BatchedRows<T>& mask, T eps1, T eps2, T* output,
                   const Activations<T>& a) {
  const int64_t n = s.tokens(), e = s.dim, f = s.dim_ff;
  ChunkScratch<T> buffers(3 * n * e);
  T* projected = buffers.take(n * e);  // an output projection before its bias and residual
  T* residual = buffers.take(s.norm_first ? n * e : 0);

  // Self-attention on x (post-norm) or LN1(x) (pre-norm).
  const T* attn_input = x;
  if (s.norm_first) {
    layer_norm_rows<T>(n, e, x, nullptr, nullptr, p.norm1_weight, p.norm1_bias, eps1, nullptr,
                       a.xhat1, a.rstd1, a.norm1_out);
    attn_input = a.norm1_out;
  }
  linear(n, e, 3 * e, attn_input, p.qkv_weight, p.qkv_bias, a.qkv);
  const HeadsProblem<T> heads(s, a.qkv, mask);
  if (s.heads == 1) {  // [B, L, hd] is already [N, E]
    attention_forward(heads.problem, a.attention, a.lse, static_cast<T*>(nullptr));
  } else {
    T* by_head = buffers.take(n * e);
    attention_forward(heads.problem, by_head, a.lse, static_cast<T*>(nullptr));
    for_each_head_row(s, e, s.head_dim(), [&](int64_t head_row, int64_t token_row) {
      std::copy(by_head + head_row, by_head + head_row + s.head_dim(), a.attention + token_row);
    });
  }
  gemm(false, true, n, e, e, T(1), a.attention, e, p.out_weight, e, T(0), projected, e);

  // The feed-forward input: LN1(x + attn) (post-norm) or LN2(x + attn) (pre-norm).
  const T* ff_input;
  if (s.norm_first) {
    layer_norm_rows<T>(n, e, x, projected, p.out_bias, p.norm2_weight, p.norm2_bias, eps2,
                       residual, a.xhat2, a.rstd2, a.norm2_out);
    ff_input = a.norm2_out;
  } else {
    layer_norm_rows<T>(n, e, x, projected, p.out_bias, p.norm1_weight, p.norm1_bias, eps1,
                       nullptr, a.xhat1, a.rstd1, a.norm1_out);
    ff_input = a.norm1_out;
  }
  linear(n, e, f, ff_input, p.ff1_weight, p.ff1_bias, a.relu_out);
  relu_in_place(n * f, a.relu_out);
  gemm(false, true, n, e, f, T(1), a.relu_out, f, p.ff2_weight, f, T(0), projected, e);
  if (s.norm_first) {
    add_rows(n, e, residual, projected, p.ff2_bias, output);
  } else {
    layer_norm_rows<T>(n, e, a.norm1_out, projected, p.ff2_bias, p.norm2_weight,
                       p.norm2_bias, eps2, nullptr, a.xhat2, a.rstd2, output);
  }
}

template <typename T>
void backward_chunk(const EncoderBlockShape& s, const T* grad_output, const T* x,
                    const EncoderBlockParams<T>& p, const BatchedRows<T>& mask,
                    const Activations<T>& a, T* grad_x, const EncoderBlockGrads<T>& g) {
  const int64_t n = s.tokens(), e = s.dim, f = s.dim_ff;
  ChunkScratch<T> buffers(11 * n * e + n * f);
  T* grad_stream = buffers.take(n * e);  // ∂L/∂(the residual stream) between the two halves
  T* grad_relu = buffers.take(n * f);
  T* grad_attn = buffers.take(n * e);
  T* grad_qkv = buffers.take(n * 3 * e);

  // Feed-forward half.
  const T* grad_ff_out = grad_output;  // pre-norm: y = h + ff(LN2(h))
  if (!s.norm_first) {                  // post-norm: y = LN2(h1 + ff(h1))
    layer_norm_backward_rows<T>(n, e, grad_output, a.xhat2, a.rstd2, p.norm2_weight,
                                grad_stream, false, g.norm2_weight, g.norm2_bias);
    grad_ff_out = grad_stream;
  }
  linear_backward<T>(n, f, e, grad_ff_out, a.relu_out, p.ff2_weight, grad_relu, false,
                     g.ff2_weight, g.ff2_bias);
  relu_backward_in_place(n * f, a.relu_out, grad_relu);
  const T* ff_input = s.norm_first ? a.norm2_out : a.norm1_out;
  if (s.norm_first) {
    // ∂L/∂h = dy + LN2'ᵀ·(dff_in)
    T* grad_ff_in = buffers.take(n * e);
    linear_backward<T>(n, e, f, grad_relu, ff_input, p.ff1_weight, grad_ff_in, false,
                       g.ff1_weight, g.ff1_bias);
    std::copy(grad_output, grad_output + n * e, grad_stream);
    layer_norm_backward_rows<T>(n, e, grad_ff_in, a.xhat2, a.rstd2, p.norm2_weight,
                                grad_stream, true, g.norm2_weight, g.norm2_bias);
  } else {
    // ∂L/∂h1 = dh2 + dff_in, then through LN1 to ∂L/∂(x + attn).
    linear_backward<T>(n, e, f, grad_relu, ff_input, p.ff1_weight, grad_stream, true,
                       g.ff1_weight, g.ff1_bias);
    layer_norm_backward_rows<T>(n, e, grad_stream, a.xhat1, a.rstd1, p.norm1_weight,
                                grad_stream, false, g.norm1_weight, g.norm1_bias);
  }

  // Attention half: grad_stream is now ∂L/∂(x + attn).
  linear_backward<T>(n, e, e, grad_stream, a.attention, p.out_weight, grad_attn, false,
                     g.out_weight, g.out_bias);
  const HeadsProblem<T> heads(s, a.qkv, mask);
  const int64_t hd = s.head_dim(), entries = s.batch * s.heads;
  std::vector<int64_t> grad_offsets(entries);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) grad_offsets[b * s.heads + h] = b * s.length * e + h * hd;
  }
  const BatchedRows<T> grad_heads{grad_attn, grad_offsets.data(), e};
  T* output_by_head = buffers.take(s.heads == 1 ? 0 : n * e);
  const T* output_heads = a.attention;
  if (s.heads > 1) {
    for_each_head_row(s, e, hd, [&](int64_t head_row, int64_t token_row) {
      std::copy(a.attention + token_row, a.attention + token_row + hd, output_by_head + head_row);
    });
    output_heads = output_by_head;
  }
  T* grad_q = buffers.take(n * e);
  T* grad_k = buffers.take(n * e);
  T* grad_v = buffers.take(n * e);
  attention_backward(heads.problem, grad_heads, output_heads, a.lse, static_cast<const T*>(nullptr),
                     grad_q, grad_k, grad_v, static_cast<T*>(nullptr), static_cast<T*>(nullptr));
  // Back into the fused projection's layout [N, per head q_h | k_h | v_h].
  for_each_head_row(s, 3 * e, 3 * hd, [&](int64_t head_row, int64_t token_row) {
    T* dst = grad_qkv + token_row;
    std::copy(grad_q + head_row, grad_q + head_row + hd, dst);
    std::copy(grad_k + head_row, grad_k + head_row + hd, dst + hd);
    std::copy(grad_v + head_row, grad_v + head_row + hd, dst + 2 * hd);
  });

  if (s.norm_first) {
    T* grad_norm1_out = buffers.take(n * e);
    linear_backward<T>(n, e, 3 * e, grad_qkv, a.norm1_out, p.qkv_weight,
                       grad_norm1_out, false, g.qkv_weight, g.qkv_bias);
    // dx = ∂L/∂h + LN1'ᵀ·dn1. Without dx, LN1's parameter gradients are still needed: the
    // input gradient then goes over dn1 itself.
    T* grad_in = grad_norm1_out;
    if (grad_x) {
      std::copy(grad_stream, grad_stream + n * e, grad_x);
      grad_in = grad_x;
    }
    layer_norm_backward_rows<T>(n, e, grad_norm1_out, a.xhat1, a.rstd1, p.norm1_weight,
                                grad_in, grad_x != nullptr, g.norm1_weight, g.norm1_bias);
  } else {
    if (grad_x) std::copy(grad_stream, grad_stream + n * e, grad_x);
    linear_backward<T>(n, e, 3 * e, grad_qkv, x, p.qkv_weight, grad_x, true, g.qkv_weight,
                       g.qkv_bias);
  }
}

// Element counts of the twelve parameters, in EncoderBlockParams' order.
std::array<int64_t, 12> param_sizes(const EncoderBlockShape& s) {
  const int64_t e = s.dim, f = s.dim_ff;
  return {3 * e * e, 3 * e, e * e, e, e, e, f * e, f, e * f, e, e, e};
}

template <typename T>
std::array<T*, 12> views_of(const EncoderBlockGrads<T>& g) {
  return {g.qkv_weight, g.qkv_bias, g.out_weight, g.out_bias, g.norm1_weight, g.norm1_bias,
          g.ff1_weight, g.ff1_bias, g.ff2_weight, g.ff2_bias, g.norm2_weight, g.norm2_bias};
}

// The parameters' gradients laid out one after another in buf.
template <typename T>
EncoderBlockGrads<T> grads_in(const EncoderBlockShape& s, T* buf) {
  std::array<T*, 12> v;
  const auto sizes = param_sizes(s);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = buf;
    buf += sizes[i];
  }
  return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10], v[11]};
}

// Batch entries split into one chunk per thread: each runs the whole block on its rows with
// sequential BLAS, so two cores cost one fork/join per pass instead of one per GEMM.
int64_t chunk_count(const EncoderBlockShape& s) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), s.batch));
}

template <typename T>
BatchedRows<T> mask_from_batch(const EncoderBlockShape& s, const BatchedRows<T>& mask,
                               int64_t b0) {
  BatchedRows<T> m = mask;
  if (m.data) m.offset += b0 * s.heads;
  return m;
}

}  // namespace

int64_t activations_size(const EncoderBlockShape& s) {
  const int64_t n = s.tokens();
  return n * (8 * s.dim + s.dim_ff + 2) + s.batch * s.heads * s.length;
}

template <typename T>
void encoder_block_forward(const EncoderBlockShape& s, const T* x, const EncoderBlockParams<T>& p,
                           const BatchedRows<T>& mask, T eps1, T eps2, T* output,
                           T* activations) {
  const Activations<T> all(s, activations);
  const int64_t chunks = chunk_count(s), row = s.length * s.dim;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    SequentialBlasScope sequential_blas;
    for (int64_t c = begin; c < end; ++c) {
      const int64_t b0 = c * s.batch / chunks, b1 = (c + 1) * s.batch / chunks;
      EncoderBlockShape part = s;
      part.batch = b1 - b0;
      forward_chunk(part, x + b0 * row, p, mask_from_batch(s, mask, b0), eps1, eps2,
                    output + b0 * row, all.from_batch(s, b0));
    }
  });
}

template <typename T>
void encoder_block_backward(const EncoderBlockShape& s, const T* grad_output, const T* x,
                            const EncoderBlockParams<T>& p, const BatchedRows<T>& mask,
                            const T* activations, T* grad_x, const EncoderBlockGrads<T>& grads) {
  const Activations<T> all(s, const_cast<T*>(activations));
  const int64_t chunks = chunk_count(s), row = s.length * s.dim;
  const auto sizes = param_sizes(s);
  const int64_t params = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  // Chunk 0 writes the parameters' gradients in place, the others into partial sums, kept
  // between calls (a fresh block cost its first-touch page faults on every call).
  ChunkScratch<T, 1> partial_block((chunks - 1) * params);
  T* const partials = partial_block.take((chunks - 1) * params);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    SequentialBlasScope sequential_blas;
    for (int64_t c = begin; c < end; ++c) {
      const int64_t b0 = c * s.batch / chunks, b1 = (c + 1) * s.batch / chunks;
      EncoderBlockShape part = s;
      part.batch = b1 - b0;
      backward_chunk(part, grad_output + b0 * row, x + b0 * row, p, mask_from_batch(s, mask, b0),
                     all.from_batch(s, b0), grad_x ? grad_x + b0 * row : nullptr,
                     c == 0 ? grads : grads_in(s, partials + (c - 1) * params));
    }
  });
  // The parameters' gradients sum over the chunks, split over the threads by element (the
  // anomaly shape has half a million; one thread summing them left the other idle).
  if (chunks == 1) return;
  const auto totals = views_of(grads);
  at::parallel_for(0, params, 1 << 14, [&](int64_t begin, int64_t end) {
    int64_t first = 0;  // flat index of tensor i's element 0
    for (size_t i = 0; i < sizes.size(); first += sizes[i], ++i) {
      const int64_t lo = std::max(begin, first), hi = std::min(end, first + sizes[i]);
      if (lo >= hi) continue;
      add_partials(hi - lo, chunks - 1, params, partials + lo, totals[i] + (lo - first));
    }
  });
}

template void encoder_block_forward<float>(const EncoderBlockShape&, const float*,
                                           const EncoderBlockParams<float>&,
                                           const BatchedRows<float>&, float, float, float*,
                                           float*);
template void encoder_block_forward<double>(const EncoderBlockShape&, const double*,
                                            const EncoderBlockParams<double>&,
                                            const BatchedRows<double>&, double, double, double*,
                                            double*);
template void encoder_block_backward<float>(const EncoderBlockShape&, const float*, const float*,
                                            const EncoderBlockParams<float>&,
                                            const BatchedRows<float>&, const float*, float*,
                                            const EncoderBlockGrads<float>&);
template void encoder_block_backward<double>(const EncoderBlockShape&, const double*,
                                             const double*, const EncoderBlockParams<double>&,
                                             const BatchedRows<double>&, const double*, double*,
                                             const EncoderBlockGrads<double>&);

}  // namespace attnlab::cpu
