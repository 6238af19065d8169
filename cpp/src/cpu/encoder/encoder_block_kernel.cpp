#include "cpu/encoder/encoder_block_kernel.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <type_traits>
#include <vector>

#include <ATen/Parallel.h>

#include "cpu/gemm/gemm.h"
#include "cpu/isa/isa.h"
#include "cpu/isa/thread_shares.h"

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

// Y[rows, out] = X[rows, in]·Wᵀ + bias, W [out, in]: the bias added as the product stores Y
// (gemm_add with one row for all), where filling Y with it first took a pass over Y (1.2 % of
// the anomaly-shape layer's time on one Intel Xeon thread).
template <typename T>
void linear(int64_t rows, int64_t in, int64_t out, const T* x, const T* weight, const T* bias,
            T* y) {
  gemm_add(false, true, rows, out, in, T(1), x, in, weight, in, T(1), bias, 0, y, out);
}

// out[c] = Σ_r x[r·ld + c] for c < cols, the rows summed in order.
template <typename T>
ATTNLAB_ISA_CLONES void column_sums(int64_t rows, int64_t cols, int64_t ld, const T* x, T* out) {
  std::fill(out, out + cols, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * ld;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

// For Y = X·Wᵀ + b over rows, W [out, in], the parameters' gradients of output features
// [o0, o1): dW[o0:o1] = dY[:, o0:o1]ᵀ·X, db[o0:o1] = Σ_rows dY[:, o0:o1]. Each element sums the
// rows in order, whatever the feature range: in blocks of at most kF32GemmMaxK rows, the
// longest sum f32_gemm takes (the BLAS's rounding may depend on the range).
template <typename T>
void linear_param_grads(int64_t rows, int64_t in, int64_t out, int64_t o0, int64_t o1,
                        const T* grad_y, const T* x, T* grad_weight, T* grad_bias) {
  if (o0 >= o1) return;
  for (int64_t r0 = 0; r0 < rows; r0 += kF32GemmMaxK) {
    gemm(true, false, o1 - o0, in, std::min(kF32GemmMaxK, rows - r0), T(1),
         grad_y + r0 * out + o0, out, x + r0 * in, in, r0 == 0 ? T(0) : T(1),
         grad_weight + o0 * in, in);
  }
  if (rows == 0) std::fill(grad_weight + o0 * in, grad_weight + o1 * in, T(0));
  column_sums(rows, o1 - o0, out, grad_y + o0, grad_bias + o0);
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
// accumulate. grad_in may alias dout.
template <typename T>
ATTNLAB_ISA_CLONES void layer_norm_backward_rows(int64_t rows, int64_t cols, const T* dout,
                                                 const T* xhat, const T* rstd, const T* weight,
                                                 T* grad_in, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dr = dout + r * cols;
    const T* xr = xhat + r * cols;
    T g_sum = 0, gx_sum = 0;
#pragma omp simd reduction(+ : g_sum, gx_sum)
    for (int64_t c = 0; c < cols; ++c) {
      const T g = dr[c] * weight[c];
      g_sum += g;
      gx_sum += g * xr[c];
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

// The LayerNorm's parameters' gradients for columns [c0, c1) of rows of cols:
// grad_weight = Σ dout·xhat, grad_shift = Σ dout, the rows summed in order.
template <typename T>
ATTNLAB_ISA_CLONES void layer_norm_param_grads(int64_t rows, int64_t cols, int64_t c0,
                                               int64_t c1, const T* dout, const T* xhat,
                                               T* grad_weight, T* grad_shift) {
  std::fill(grad_weight + c0, grad_weight + c1, T(0));
  std::fill(grad_shift + c0, grad_shift + c1, T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* dr = dout + r * cols;
    const T* xr = xhat + r * cols;
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) {
      grad_weight[c] += dr[c] * xr[c];
      grad_shift[c] += dr[c];
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
  // Each entry's rows in the token layout [N, E] (the attention's output, its gradient).
  std::vector<int64_t> out_offsets;

  HeadsProblem(const EncoderBlockShape& s, const T* qkv, const BatchedRows<T>& mask) {
    const int64_t hd = s.head_dim(), entries = s.batch * s.heads;
    q_offsets.resize(entries);
    k_offsets.resize(entries);
    v_offsets.resize(entries);
    out_offsets.resize(entries);
    for (int64_t b = 0; b < s.batch; ++b) {
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t i = b * s.heads + h, base = b * s.length * 3 * s.dim + h * 3 * hd;
        q_offsets[i] = base;
        k_offsets[i] = base + hd;
        v_offsets[i] = base + 2 * hd;
        out_offsets[i] = b * s.length * s.dim + h * hd;
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
  if (attention_is_small(heads.problem)) {  // straight into the token rows [N, E]
    attention_forward_rows(heads.problem, OutputRows<T>{a.attention, heads.out_offsets.data(), e},
                           a.lse);
  } else if (s.heads == 1) {  // [B, L, hd] is already [N, E]
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

// The gradients of the block's activations that the parameters' gradients are sums over, for
// every row: the backward's first pass writes them row by row (each thread its batch entries),
// the second sums them over all rows (each thread its output features), so that no thread's
// partial sums have to be added afterwards and every sum runs over the rows in one order.
// Post-norm / pre-norm:
//   ff_out:   ∂L/∂(ff2's output): LN2'(dy) / dy itself (not stored: grad_output)  [N, E]
//   relu:     ∂L/∂(ff1's output), the ReLU's mask applied                         [N, F]
//   norm2:    ∂L/∂LN2's output: dy (not stored) / ∂L/∂LN2(h)                        [N, E]
//   norm1:    ∂L/∂LN1's output: ∂L/∂h1 / ∂L/∂LN1(x)                                 [N, E]
//   attn_out: ∂L/∂(the output projection's output): LN1'(∂L/∂h1) / ∂L/∂h           [N, E]
//   qkv:      ∂L/∂(the fused projection's output), per head [q_h | k_h | v_h]        [N, 3E]
template <typename T>
struct ActivationGrads {
  T *ff_out, *relu, *norm2, *norm1, *attn_out, *qkv;

  static int64_t size(const EncoderBlockShape& s) {
    return s.tokens() * (7 * s.dim + s.dim_ff);
  }
  ActivationGrads(const EncoderBlockShape& s, T* base) {
    const int64_t n = s.tokens(), e = s.dim;
    ff_out = base;
    relu = ff_out + n * e;
    norm2 = relu + n * s.dim_ff;
    norm1 = norm2 + n * e;
    attn_out = norm1 + n * e;
    qkv = attn_out + n * e;
  }
  ActivationGrads from_batch(const EncoderBlockShape& s, int64_t b0) const {
    ActivationGrads g = *this;
    const int64_t r0 = b0 * s.length, e = s.dim;
    for (T** view : {&g.ff_out, &g.norm2, &g.norm1, &g.attn_out}) *view += r0 * e;
    g.relu += r0 * s.dim_ff;
    g.qkv += r0 * 3 * e;
    return g;
  }
};

// The backward's first pass on the batch entries of s: the activations' gradients (d) and dx.
template <typename T>
void backward_rows(const EncoderBlockShape& s, const T* grad_output, const EncoderBlockParams<T>& p,
                   const BatchedRows<T>& mask, const Activations<T>& a, T* grad_x,
                   const ActivationGrads<T>& d) {
  const int64_t n = s.tokens(), e = s.dim, f = s.dim_ff, hd = s.head_dim();
  ChunkScratch<T> buffers(5 * n * e);
  T* grad_attn = buffers.take(n * e);

  // Feed-forward half, then ∂L/∂(the output projection's output) in d.attn_out.
  const T* grad_ff_out = grad_output;  // pre-norm: y = h + ff(LN2(h))
  if (!s.norm_first) {                  // post-norm: y = LN2(h1 + ff(h1))
    layer_norm_backward_rows<T>(n, e, grad_output, a.xhat2, a.rstd2, p.norm2_weight, d.ff_out,
                                false);
    grad_ff_out = d.ff_out;
  }
  gemm(false, false, n, f, e, T(1), grad_ff_out, e, p.ff2_weight, f, T(0), d.relu, f);
  relu_backward_in_place(n * f, a.relu_out, d.relu);
  if (s.norm_first) {
    // ∂L/∂h = dy + LN2'ᵀ·(∂L/∂LN2(h))
    gemm(false, false, n, e, f, T(1), d.relu, f, p.ff1_weight, e, T(0), d.norm2, e);
    std::copy(grad_output, grad_output + n * e, d.attn_out);
    layer_norm_backward_rows<T>(n, e, d.norm2, a.xhat2, a.rstd2, p.norm2_weight, d.attn_out,
                                true);
  } else {
    // ∂L/∂h1 = dh2 + dff_in, then through LN1 to ∂L/∂(x + attn).
    gemm_add(false, false, n, e, f, T(1), d.relu, f, p.ff1_weight, e, T(1), d.ff_out, e, d.norm1,
             e);
    layer_norm_backward_rows<T>(n, e, d.norm1, a.xhat1, a.rstd1, p.norm1_weight, d.attn_out,
                                false);
  }

  // Attention half.
  gemm(false, false, n, e, e, T(1), d.attn_out, e, p.out_weight, e, T(0), grad_attn, e);
  const HeadsProblem<T> heads(s, a.qkv, mask);
  const BatchedRows<T> grad_heads{grad_attn, heads.out_offsets.data(), e};
  if (attention_is_small(heads.problem)) {
    // The gradients straight into the fused projection's layout, and the forward's output
    // (which the small kernels do not read) left where it is.
    const auto qkv_rows = [&](const std::vector<int64_t>& offsets) {
      return OutputRows<T>{d.qkv, offsets.data(), 3 * e};
    };
    attention_backward_rows(heads.problem, grad_heads, a.lse, qkv_rows(heads.q_offsets),
                            qkv_rows(heads.k_offsets), qkv_rows(heads.v_offsets));
  } else {
    T* output_by_head = buffers.take(s.heads == 1 ? 0 : n * e);
    const T* output_heads = a.attention;
    if (s.heads > 1) {
      for_each_head_row(s, e, hd, [&](int64_t head_row, int64_t token_row) {
        std::copy(a.attention + token_row, a.attention + token_row + hd,
                  output_by_head + head_row);
      });
      output_heads = output_by_head;
    }
    T* grad_q = buffers.take(n * e);
    T* grad_k = buffers.take(n * e);
    T* grad_v = buffers.take(n * e);
    attention_backward(heads.problem, grad_heads, output_heads, a.lse,
                       static_cast<const T*>(nullptr), grad_q, grad_k, grad_v,
                       static_cast<T*>(nullptr), static_cast<T*>(nullptr));
    // Back into the fused projection's layout [N, per head q_h | k_h | v_h].
    for_each_head_row(s, 3 * e, 3 * hd, [&](int64_t head_row, int64_t token_row) {
      T* dst = d.qkv + token_row;
      std::copy(grad_q + head_row, grad_q + head_row + hd, dst);
      std::copy(grad_k + head_row, grad_k + head_row + hd, dst + hd);
      std::copy(grad_v + head_row, grad_v + head_row + hd, dst + 2 * hd);
    });
  }

  if (s.norm_first) {
    // dx = ∂L/∂h + LN1'ᵀ·(∂L/∂LN1(x)); ∂L/∂LN1(x) is kept for LN1's parameters either way.
    gemm(false, false, n, e, 3 * e, T(1), d.qkv, 3 * e, p.qkv_weight, e, T(0), d.norm1, e);
    if (grad_x) {
      std::copy(d.attn_out, d.attn_out + n * e, grad_x);
      layer_norm_backward_rows<T>(n, e, d.norm1, a.xhat1, a.rstd1, p.norm1_weight, grad_x, true);
    }
  } else if (grad_x) {
    gemm_add(false, false, n, e, 3 * e, T(1), d.qkv, 3 * e, p.qkv_weight, e, T(1), d.attn_out, e,
             grad_x, e);
  }
}

// The backward's second pass: the parameters' gradients, each summed over all rows. Its work
// is laid out as one sequence: the four weights' rows (output features), each costing its
// fan-in, then the two LayerNorms' columns, costing 2 each. A thread takes the fraction
// [share, share_end) of the sequence's cost, its ends rounded to whole vectors of features, so
// that most weights have one thread (both threads packing the same X for a weight split
// between them cost 17 % of the reversal-shape layer) and at the even split of 2 threads none
// is split at the tutorials' shapes (d_ff = 2·d).
template <typename T>
void backward_params(const EncoderBlockShape& s, const T* grad_output, const T* x,
                     const Activations<T>& a, const ActivationGrads<T>& d, double share,
                     double share_end, const EncoderBlockGrads<T>& g) {
  const int64_t n = s.tokens(), e = s.dim, f = s.dim_ff;
  struct Segment {
    int64_t rows, cost;  // features, cost of each
  };
  const Segment segments[6] = {{3 * e, e}, {e, e}, {f, e}, {e, f}, {e, 2}, {e, 2}};
  double total = 0;
  for (const Segment& seg : segments) total += static_cast<double>(seg.rows * seg.cost);
  double offset = 0;  // the cost before the segment
  // The segment's features before a position in the sequence, in whole vectors.
  const auto cut = [&](const Segment& seg, double fraction) {
    constexpr int64_t kStep = 16;
    if (fraction >= 1.0) return seg.rows;
    const double rows = (fraction * total - offset) / static_cast<double>(seg.cost);
    const int64_t whole = static_cast<int64_t>(std::clamp(rows / kStep + 0.5, 0.0, 1e18)) * kStep;
    return std::min(whole, seg.rows);
  };
  int64_t r0[6], r1[6];
  for (int i = 0; i < 6; ++i) {
    r0[i] = cut(segments[i], share);
    r1[i] = cut(segments[i], share_end);
    offset += static_cast<double>(segments[i].rows * segments[i].cost);
  }
  const T* ff_out = s.norm_first ? grad_output : d.ff_out;
  const T* ff_input = s.norm_first ? a.norm2_out : a.norm1_out;
  const T* qkv_input = s.norm_first ? a.norm1_out : x;
  linear_param_grads(n, e, 3 * e, r0[0], r1[0], d.qkv, qkv_input, g.qkv_weight, g.qkv_bias);
  linear_param_grads(n, e, e, r0[1], r1[1], d.attn_out, a.attention, g.out_weight, g.out_bias);
  linear_param_grads(n, e, f, r0[2], r1[2], d.relu, ff_input, g.ff1_weight, g.ff1_bias);
  linear_param_grads(n, f, e, r0[3], r1[3], ff_out, a.relu_out, g.ff2_weight, g.ff2_bias);
  layer_norm_param_grads(n, e, r0[4], r1[4], d.norm1, a.xhat1, g.norm1_weight, g.norm1_bias);
  layer_norm_param_grads(n, e, r0[5], r1[5], s.norm_first ? d.norm2 : grad_output, a.xhat2,
                         g.norm2_weight, g.norm2_bias);
}

// The batch entries (or, in the backward's second pass, the parameters' features) split into
// one part per thread: each runs the whole block on its rows with sequential BLAS, so two
// cores cost one fork/join per pass instead of one per GEMM.
int64_t part_count(const EncoderBlockShape& s) {
  return std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), s.batch));
}

// Each pass's estimate of its threads' speeds.
ThreadShares forward_shares, backward_row_shares, backward_param_shares;

// Runs body(begin, end) on each part of `units` as shares splits them, one part per thread,
// and tells shares how long each part took. Only where float32 products run in f32_gemm, whose
// rows and columns round the same in a product of any size: elsewhere (double, or float32
// through the BLAS) the split stays even, so that results do not change from call to call.
template <typename T, typename F>
void run_parts(ThreadShares& shares, int64_t units, int64_t parts, const F& body) {
  static const ThreadShares even;
  const bool adaptive = std::is_same_v<T, float> && f32_gemm_available();
  const std::vector<int64_t> bounds = (adaptive ? shares : even).split(units, parts);
  std::vector<double> seconds(parts, 0.0);
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    SequentialBlasScope sequential_blas;
    for (int64_t c = begin; c < end; ++c) {
      const double start = ThreadShares::now();
      body(bounds[c], bounds[c + 1]);
      seconds[c] = ThreadShares::now() - start;
    }
  });
  if (adaptive) shares.update(bounds, seconds.data());
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
  const int64_t row = s.length * s.dim;
  run_parts<T>(forward_shares, s.batch, part_count(s), [&](int64_t b0, int64_t b1) {
    EncoderBlockShape part = s;
    part.batch = b1 - b0;
    forward_chunk(part, x + b0 * row, p, mask_from_batch(s, mask, b0), eps1, eps2,
                  output + b0 * row, all.from_batch(s, b0));
  });
}

template <typename T>
void encoder_block_backward(const EncoderBlockShape& s, const T* grad_output, const T* x,
                            const EncoderBlockParams<T>& p, const BatchedRows<T>& mask,
                            const T* activations, T* grad_x, const EncoderBlockGrads<T>& grads) {
  const Activations<T> all(s, const_cast<T*>(activations));
  const int64_t row = s.length * s.dim, parts = part_count(s);
  // Kept between calls (a fresh block cost its first-touch page faults on every call).
  ChunkScratch<T, 1> block(ActivationGrads<T>::size(s));
  const ActivationGrads<T> d(s, block.take(ActivationGrads<T>::size(s)));
  run_parts<T>(backward_row_shares, s.batch, parts, [&](int64_t b0, int64_t b1) {
    EncoderBlockShape part = s;
    part.batch = b1 - b0;
    backward_rows(part, grad_output + b0 * row, p, mask_from_batch(s, mask, b0),
                  all.from_batch(s, b0), grad_x ? grad_x + b0 * row : nullptr,
                  d.from_batch(s, b0));
  });
  constexpr int64_t kFractions = 1024;
  run_parts<T>(backward_param_shares, kFractions, parts, [&](int64_t begin, int64_t end) {
    backward_params(s, grad_output, x, all, d, static_cast<double>(begin) / kFractions,
                    static_cast<double>(end) / kFractions, grads);
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
