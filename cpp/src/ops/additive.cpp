// attnlab::additive_scores: Bahdanau scores w·tanh(query_proj + key_proj) for every query/key
// pair, with its forward/backward operators and autograd formula.

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "attnlab/attention.h"
#include "cpu/attention/additive_kernel.h"
#include "ops/checks.h"

namespace attnlab {
namespace {

using at::Tensor;

Tensor additive_scores_forward_cpu(const Tensor& query_proj, const Tensor& key_proj,
                                   const Tensor& weight) {
  checks::additive_scores_inputs(query_proj, key_proj, weight);
  const Tensor qp = query_proj.contiguous(), kp = key_proj.contiguous(), w = weight.contiguous();
  const int64_t batch = qp.size(0), len_q = qp.size(1), len_k = kp.size(1), hidden = qp.size(2);
  Tensor scores = at::empty({batch, len_q, len_k}, qp.options());
  AT_DISPATCH_FLOATING_TYPES(qp.scalar_type(), "attnlab_additive_scores", [&] {
    cpu::additive_scores_forward<scalar_t>(qp.data_ptr<scalar_t>(), kp.data_ptr<scalar_t>(),
                                           w.data_ptr<scalar_t>(), batch, len_q, len_k, hidden,
                                           scores.data_ptr<scalar_t>());
  });
  return scores;
}

std::tuple<Tensor, Tensor, Tensor> additive_scores_backward_cpu(const Tensor& grad_scores,
                                                                const Tensor& query_proj,
                                                                const Tensor& key_proj,
                                                                const Tensor& weight) {
  checks::additive_scores_inputs(query_proj, key_proj, weight);
  const Tensor qp = query_proj.contiguous(), kp = key_proj.contiguous(), w = weight.contiguous();
  const int64_t batch = qp.size(0), len_q = qp.size(1), len_k = kp.size(1), hidden = qp.size(2);
  TORCH_CHECK(grad_scores.sizes() == at::IntArrayRef({batch, len_q, len_k}),
              "attnlab.additive_scores backward: grad_scores has shape ", grad_scores.sizes(),
              ", expected [", batch, ", ", len_q, ", ", len_k, "]");
  const Tensor g = grad_scores.to(qp.scalar_type()).contiguous();
  Tensor grad_qp = at::empty_like(qp), grad_kp = at::empty_like(kp), grad_w = at::empty_like(w);
  AT_DISPATCH_FLOATING_TYPES(qp.scalar_type(), "attnlab_additive_scores_backward", [&] {
    cpu::additive_scores_backward<scalar_t>(
        g.data_ptr<scalar_t>(), qp.data_ptr<scalar_t>(), kp.data_ptr<scalar_t>(),
        w.data_ptr<scalar_t>(), batch, len_q, len_k, hidden, grad_qp.data_ptr<scalar_t>(),
        grad_kp.data_ptr<scalar_t>(), grad_w.data_ptr<scalar_t>());
  });
  return {grad_qp, grad_kp, grad_w};
}

class AdditiveScoresFunction : public torch::autograd::Function<AdditiveScoresFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const Tensor& query_proj,
                                                const Tensor& key_proj, const Tensor& weight) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("attnlab::_additive_scores_forward", "")
                         .typed<decltype(additive_scores_forward_cpu)>();
    ctx->save_for_backward({query_proj, key_proj, weight});
    return {op.call(query_proj, key_proj, weight)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("attnlab::_additive_scores_backward", "")
                         .typed<decltype(additive_scores_backward_cpu)>();
    const auto saved = ctx->get_saved_variables();
    auto [dq, dk, dw] = op.call(grads[0], saved[0], saved[1], saved[2]);
    return {dq, dk, dw};
  }
};

Tensor additive_scores_composite(const Tensor& query_proj, const Tensor& key_proj,
                                 const Tensor& weight) {
  // Before dispatch: a meta or fake input would otherwise skip the CPU kernel's checks.
  checks::additive_scores_kinds(query_proj, key_proj, weight);
  return AdditiveScoresFunction::apply(query_proj, key_proj, weight)[0];
}

}  // namespace

at::Tensor additive_scores(const at::Tensor& query_proj, const at::Tensor& key_proj,
                           const at::Tensor& weight) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("attnlab::additive_scores", "")
                       .typed<decltype(additive_scores_composite)>();
  return op.call(query_proj, key_proj, weight);
}

}  // namespace attnlab

TORCH_LIBRARY_FRAGMENT(attnlab, m) {
  m.def("additive_scores(Tensor query_proj, Tensor key_proj, Tensor weight) -> Tensor");
  m.def("_additive_scores_forward(Tensor query_proj, Tensor key_proj, Tensor weight) -> Tensor");
  m.def(
      "_additive_scores_backward(Tensor grad_scores, Tensor query_proj, Tensor key_proj, "
      "Tensor weight) -> (Tensor grad_query_proj, Tensor grad_key_proj, Tensor grad_weight)");
}

TORCH_LIBRARY_IMPL(attnlab, CompositeImplicitAutograd, m) {
  m.impl("additive_scores", &attnlab::additive_scores_composite);
}

TORCH_LIBRARY_IMPL(attnlab, CPU, m) {
  m.impl("_additive_scores_forward", &attnlab::additive_scores_forward_cpu);
  m.impl("_additive_scores_backward", &attnlab::additive_scores_backward_cpu);
}
