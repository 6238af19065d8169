// attnlab::encoder_block: one transformer encoder block (the tutorial's EncoderBlock without
// dropout) as a single operator, with its forward/backward operators and autograd formula.
// Fusing the block removes the per-op dispatch, autograd and layout copies that dominate a
// small layer's time (benchmarks/encoder_cpu.py).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "attnlab/attention.h"
#include "cpu/encoder/encoder_block_kernel.h"
#include "ops/checks.h"
#include "ops/layout.h"

namespace attnlab {
namespace {

using at::Tensor;
using at::TensorList;

constexpr int64_t kParams = 12;  // qkv, out, norm1, ff1, ff2, norm2: weight and bias each

cpu::EncoderBlockShape block_shape(const Tensor& x, TensorList params, int64_t num_heads,
                                   bool norm_first) {
  cpu::EncoderBlockShape s;
  s.batch = x.size(0);
  s.length = x.size(1);
  s.dim = x.size(2);
  s.heads = num_heads;
  s.dim_ff = params[6].size(0);
  s.norm_first = norm_first;
  return s;
}

// The twelve tensors' data, in order, as EncoderBlockParams<T> or EncoderBlockGrads<T>.
template <typename Pointers, typename T>
Pointers pointers(const std::vector<Tensor>& p) {
  return {p[0].data_ptr<T>(), p[1].data_ptr<T>(), p[2].data_ptr<T>(),  p[3].data_ptr<T>(),
          p[4].data_ptr<T>(), p[5].data_ptr<T>(), p[6].data_ptr<T>(),  p[7].data_ptr<T>(),
          p[8].data_ptr<T>(), p[9].data_ptr<T>(), p[10].data_ptr<T>(), p[11].data_ptr<T>()};
}

std::vector<Tensor> contiguous_all(TensorList params) {
  std::vector<Tensor> out;
  out.reserve(params.size());
  for (const Tensor& p : params) out.push_back(p.contiguous());
  return out;
}

// The mask as additive rows for each (batch, head) entry; data == nullptr without a mask.
template <typename T>
cpu::BatchedRows<T> mask_rows(const std::optional<Tensor>& attn_mask, const Tensor& x,
                              int64_t num_heads, Tensor& storage,
                              std::vector<int64_t>& offsets) {
  if (!attn_mask || !attn_mask->defined()) return {};
  const int64_t length = x.size(1);
  storage = additive_mask(*attn_mask, x, length);
  const Tensor rows = storage.expand({x.size(0), num_heads, length, length});
  auto mask = batched_rows<T>(rows, {x.size(0), num_heads}, offsets);
  mask.row_stride = rows.stride(-2);  // 0 when one mask row serves every query
  return mask;
}

std::tuple<Tensor, Tensor> encoder_block_forward_cpu(const Tensor& x, TensorList params,
                                                     int64_t num_heads,
                                                     const std::optional<Tensor>& attn_mask,
                                                     bool norm_first, double norm1_eps,
                                                     double norm2_eps) {
  checks::encoder_block_inputs(x, params, num_heads, attn_mask, norm1_eps, norm2_eps);
  TORCH_CHECK(!at::isReducedFloatingType(x.scalar_type()),
              "attnlab._encoder_block_forward: x is ", x.scalar_type(), "; the kernel takes "
              "float32 or float64 (attnlab.encoder_block widens float16 and bfloat16 itself)");
  const auto shape = block_shape(x, params, num_heads, norm_first);
  const Tensor input = x.contiguous();
  const auto p = contiguous_all(params);
  Tensor output = at::empty_like(input);
  // From the weights' pool: fresh memory for the activations on every call cost the
  // reversal-shape layer (2.6 MB of them) 1.19x its time in page faults (in-process A/B,
  // 30 rounds; no change at the anomaly shape).
  Tensor activations = empty_weights({cpu::activations_size(shape)}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "attnlab_encoder_block_forward", [&] {
    Tensor mask_storage;
    std::vector<int64_t> mask_offsets;
    const auto mask = mask_rows<scalar_t>(attn_mask, input, num_heads, mask_storage, mask_offsets);
    cpu::encoder_block_forward<scalar_t>(
        shape, input.data_ptr<scalar_t>(), pointers<cpu::EncoderBlockParams<scalar_t>, scalar_t>(p),
        mask,
        static_cast<scalar_t>(norm1_eps), static_cast<scalar_t>(norm2_eps),
        output.data_ptr<scalar_t>(), activations.data_ptr<scalar_t>());
  });
  return {output, activations};
}

std::vector<Tensor> encoder_block_backward_cpu(const Tensor& grad_output, const Tensor& x,
                                               TensorList params, int64_t num_heads,
                                               const std::optional<Tensor>& attn_mask,
                                               bool norm_first, const Tensor& activations,
                                               bool input_grad) {
  checks::encoder_block_inputs(x, params, num_heads, attn_mask, 0.0, 0.0);
  const auto shape = block_shape(x, params, num_heads, norm_first);
  TORCH_CHECK(grad_output.sizes() == x.sizes(), "attnlab.encoder_block backward: grad_output has "
              "shape ", grad_output.sizes(), " but x has ", x.sizes());
  TORCH_CHECK(activations.dim() == 1 && activations.numel() == cpu::activations_size(shape) &&
                  activations.scalar_type() == x.scalar_type(),
              "attnlab.encoder_block backward: activations must be the forward's (",
              cpu::activations_size(shape), " elements of ", x.scalar_type(), "), got ",
              activations.sizes(), " of ", activations.scalar_type());
  const Tensor input = x.contiguous();
  const auto p = contiguous_all(params);
  const Tensor grad = grad_output.to(x.scalar_type()).contiguous();
  const Tensor saved = activations.contiguous();
  std::vector<Tensor> grads;
  grads.push_back(input_grad ? at::empty_like(input) : at::empty({0}, x.options()));
  for (const Tensor& param : p) grads.push_back(at::empty_like(param));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "attnlab_encoder_block_backward", [&] {
    Tensor mask_storage;
    std::vector<int64_t> mask_offsets;
    const auto mask = mask_rows<scalar_t>(attn_mask, input, num_heads, mask_storage, mask_offsets);
    const std::vector<Tensor> param_grads(grads.begin() + 1, grads.end());
    cpu::encoder_block_backward<scalar_t>(
        shape, grad.data_ptr<scalar_t>(), input.data_ptr<scalar_t>(),
        pointers<cpu::EncoderBlockParams<scalar_t>, scalar_t>(p), mask,
        saved.data_ptr<scalar_t>(), input_grad ? grads[0].data_ptr<scalar_t>() : nullptr,
        pointers<cpu::EncoderBlockGrads<scalar_t>, scalar_t>(param_grads));
  });
  return grads;
}

class EncoderBlockFunction : public torch::autograd::Function<EncoderBlockFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& x, TensorList params,
                                                int64_t num_heads,
                                                const std::optional<Tensor>& attn_mask,
                                                bool norm_first, double norm1_eps,
                                                double norm2_eps) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("attnlab::_encoder_block_forward", "")
                         .typed<decltype(encoder_block_forward_cpu)>();
    auto [output, activations] =
        op.call(x, params, num_heads, attn_mask, norm_first, norm1_eps, norm2_eps);
    std::vector<Tensor> saved{x, activations, attn_mask.value_or(Tensor())};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["num_heads"] = num_heads;
    ctx->saved_data["norm_first"] = norm_first;
    return {output};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("attnlab::_encoder_block_backward", "")
                         .typed<decltype(encoder_block_backward_cpu)>();
    const auto saved = ctx->get_saved_variables();
    const std::vector<Tensor> params(saved.begin() + 3, saved.end());
    const std::optional<Tensor> mask =
        saved[2].defined() ? std::optional<Tensor>(saved[2]) : std::nullopt;
    const bool input_grad = ctx->needs_input_grad(0);
    auto computed = op.call(grads[0], saved[0], params, ctx->saved_data["num_heads"].toInt(),
                            mask, ctx->saved_data["norm_first"].toBool(), saved[1], input_grad);
    // One entry per forward argument: x, the parameters, then five that get no gradient
    // (the mask, a constant here, among them).
    torch::autograd::variable_list result;
    result.push_back(input_grad ? computed[0] : Tensor());
    result.insert(result.end(), computed.begin() + 1, computed.end());
    result.resize(1 + kParams + 5);
    return result;
  }
};

Tensor encoder_block_composite(const Tensor& x, const Tensor& qkv_weight, const Tensor& qkv_bias,
                               const Tensor& out_weight, const Tensor& out_bias,
                               const Tensor& norm1_weight, const Tensor& norm1_bias,
                               const Tensor& ff1_weight, const Tensor& ff1_bias,
                               const Tensor& ff2_weight, const Tensor& ff2_bias,
                               const Tensor& norm2_weight, const Tensor& norm2_bias,
                               int64_t num_heads, const std::optional<Tensor>& attn_mask,
                               bool norm_first, double norm1_eps, double norm2_eps) {
  const std::vector<Tensor> params{qkv_weight, qkv_bias,  out_weight,   out_bias,
                                   norm1_weight, norm1_bias, ff1_weight, ff1_bias,
                                   ff2_weight,   ff2_bias,   norm2_weight, norm2_bias};
  // Before dispatch: a meta or fake input would otherwise skip the CPU kernel's checks.
  checks::encoder_block_kinds(x, params, attn_mask);
  TORCH_CHECK(!attn_mask || !attn_mask->defined() || !attn_mask->requires_grad(),
              "attnlab.encoder_block: attn_mask gets no gradient here; use "
              "attnlab.scaled_dot_product_attention for a learnable mask");
  if (at::isReducedFloatingType(x.scalar_type())) {
    // float16 and bfloat16 run through the float32 kernel: x and the parameters are widened
    // (autograd rounds their gradients back), every product and sum is float32, and only the
    // output is rounded.
    std::vector<Tensor> wide;
    wide.reserve(params.size());
    for (const Tensor& p : params) wide.push_back(p.to(at::kFloat));
    const std::optional<Tensor> mask =
        attn_mask && attn_mask->defined() && attn_mask->is_floating_point()
            ? std::optional<Tensor>(attn_mask->to(at::kFloat))
            : attn_mask;
    return EncoderBlockFunction::apply(x.to(at::kFloat), TensorList(wide), num_heads, mask,
                                       norm_first, norm1_eps, norm2_eps)[0]
        .to(x.scalar_type());
  }
  // As a TensorList, so that autograd sees each parameter as an input of its own.
  return EncoderBlockFunction::apply(x, TensorList(params), num_heads, attn_mask, norm_first,
                                     norm1_eps, norm2_eps)[0];
}

}  // namespace

at::Tensor encoder_block(const at::Tensor& x, const EncoderBlockWeights& w, int64_t num_heads,
                         const std::optional<at::Tensor>& attn_mask, bool norm_first,
                         double norm1_eps, double norm2_eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::encoder_block", "")
                       .typed<decltype(encoder_block_composite)>();
  return op.call(x, w.qkv_weight, w.qkv_bias, w.out_weight, w.out_bias, w.norm1_weight,
                 w.norm1_bias, w.ff1_weight, w.ff1_bias, w.ff2_weight, w.ff2_bias,
                 w.norm2_weight, w.norm2_bias, num_heads, attn_mask, norm_first, norm1_eps,
                 norm2_eps);
}

}  // namespace attnlab

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def(
      "encoder_block(Tensor x, Tensor qkv_weight, Tensor qkv_bias, Tensor out_weight, "
      "Tensor out_bias, Tensor norm1_weight, Tensor norm1_bias, Tensor ff1_weight, "
      "Tensor ff1_bias, Tensor ff2_weight, Tensor ff2_bias, Tensor norm2_weight, "
      "Tensor norm2_bias, int num_heads, Tensor? attn_mask=None, bool norm_first=False, "
      "float norm1_eps=1e-05, float norm2_eps=1e-05) -> Tensor");
  m.def(
      "_encoder_block_forward(Tensor x, Tensor[] params, int num_heads, Tensor? attn_mask, "
      "bool norm_first, float norm1_eps, float norm2_eps) -> (Tensor output, Tensor activations)");
  m.def(
      "_encoder_block_backward(Tensor grad_output, Tensor x, Tensor[] params, int num_heads, "
      "Tensor? attn_mask, bool norm_first, Tensor activations, bool input_grad) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(attnlab, CompositeImplicitAutograd, m) {
  m.impl("encoder_block", &attnlab::encoder_block_composite);
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("_encoder_block_forward", &attnlab::encoder_block_forward_cpu);
  m.impl("_encoder_block_backward", &attnlab::encoder_block_backward_cpu);
}
