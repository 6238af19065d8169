#include "ops/checks.h"

#include <cmath>
#include <sstream>

#include <c10/util/Exception.h>

#include "attnlab/build_info.h"

namespace attnlab::checks {
namespace {

// A torch other than the one attnlab was compiled against: refuse, naming both versions.
void torch_compatible(const char* op) {
  static const std::string problem = torch_version_problem();
  TORCH_CHECK(problem.empty(), op, ": ", problem);
}

constexpr const char* kSdpa = "attnlab.scaled_dot_product_attention";
constexpr const char* kOp = "attnlab.additive_scores";

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

void floating_input(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.defined(), kSdpa, ": ", name, " is an undefined tensor");
  TORCH_CHECK(t.dim() >= 2, kSdpa, ": ", name,
              " must have at least 2 dimensions [..., length, features], got shape ",
              shape_str(t.sizes()));
  const auto dtype = t.scalar_type();
  if (t.is_cuda()) {
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, kSdpa, ": ",
                name, " must be float32, float16 or bfloat16 on CUDA, got ", dtype);
  } else {
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
                    dtype == at::kBFloat16,
                kSdpa, ": ", name, " must be float32, float64, float16 or bfloat16 on the CPU, got ",
                dtype);
  }
}

// Right-aligned broadcast of `b` into `a`, as torch broadcasting does.
std::optional<std::vector<int64_t>> broadcast(at::IntArrayRef a, at::IntArrayRef b) {
  std::vector<int64_t> out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[out.size() - 1 - i] = da == 1 ? db : da;
  }
  return out;
}

// The mask's dtype (bool or floating point) and device (that of `input`), for operator `op`.
void mask_kind(const char* op, const std::optional<at::Tensor>& attn_mask,
               const at::Tensor& input, const char* input_name) {
  if (!attn_mask || !attn_mask->defined()) return;
  const auto& mask = *attn_mask;
  TORCH_CHECK(mask.scalar_type() == at::kBool || at::isFloatingType(mask.scalar_type()), op,
              ": attn_mask must be bool (true = may attend) or floating point (added to the "
              "scores), got ", mask.scalar_type());
  TORCH_CHECK(mask.device() == input.device(), op, ": attn_mask is on ", mask.device(), " but ",
              input_name, " is on ", input.device());
}

}  // namespace

void sdpa_kinds(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  torch_compatible(kSdpa);
  floating_input(query, "query");
  floating_input(key, "key");
  floating_input(value, "value");
  for (const auto& [t, name] : {std::pair{&key, "key"}, std::pair{&value, "value"}}) {
    TORCH_CHECK(t->scalar_type() == query.scalar_type(), kSdpa, ": ", name, " has dtype ",
                t->scalar_type(), " but query has ", query.scalar_type(),
                "; all three inputs must share one dtype");
    TORCH_CHECK(t->device() == query.device(), kSdpa, ": ", name, " is on ", t->device(),
                " but query is on ", query.device(), "; all inputs must be on one device");
  }
  mask_kind(kSdpa, attn_mask, query, "query");
  if (scale) {
    TORCH_CHECK(std::isfinite(*scale), kSdpa, ": scale must be a finite number, got ", *scale);
  }
}

std::vector<int64_t> sdpa_inputs(const at::Tensor& query, const at::Tensor& key,
                                 const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask,
                                 std::optional<double> scale) {
  sdpa_kinds(query, key, value, attn_mask, scale);
  const int64_t len_q = query.size(-2), len_k = key.size(-2);
  TORCH_CHECK(query.size(-1) > 0, kSdpa, ": query must have at least one feature, got shape ",
              shape_str(query.sizes()));
  TORCH_CHECK(key.size(-1) == query.size(-1), kSdpa, ": key has ", key.size(-1),
              " features per position but query has ", query.size(-1));
  TORCH_CHECK(value.size(-2) == len_k, kSdpa, ": value has ", value.size(-2),
              " positions but key has ", len_k, "; they must match");

  const auto q_batch = query.sizes().slice(0, query.dim() - 2);
  const auto k_batch = key.sizes().slice(0, key.dim() - 2);
  const auto v_batch = value.sizes().slice(0, value.dim() - 2);
  auto qk = broadcast(q_batch, k_batch);
  TORCH_CHECK(qk, kSdpa, ": batch dimensions of query ", shape_str(q_batch), " and key ",
              shape_str(k_batch), " are not broadcastable");
  auto batch = broadcast(*qk, v_batch);
  TORCH_CHECK(batch, kSdpa, ": batch dimensions of value ", shape_str(v_batch),
              " are not broadcastable with those of query and key ", shape_str(*qk));

  if (attn_mask && attn_mask->defined()) {
    std::vector<int64_t> weights_shape = *batch;
    weights_shape.push_back(len_q);
    weights_shape.push_back(len_k);
    const auto mask_shape = attn_mask->sizes();
    auto merged = broadcast(weights_shape, mask_shape);
    TORCH_CHECK(merged && *merged == weights_shape, kSdpa, ": attn_mask of shape ",
                shape_str(mask_shape), " is not broadcastable to the attention weights' shape ",
                shape_str(weights_shape), " [..., L_q, L_k]");
  }
  return *batch;
}

void sdpa_backward_inputs(const at::Tensor& grad_output, const at::Tensor& output,
                          const at::Tensor& logsumexp, const std::optional<at::Tensor>& weights,
                          at::IntArrayRef batch_shape, int64_t len_q, int64_t len_k,
                          int64_t dim_v) {
  std::vector<int64_t> out_shape(batch_shape.begin(), batch_shape.end());
  out_shape.push_back(len_q);
  if (weights && weights->numel() > 0) {
    auto weights_shape = out_shape;
    weights_shape.push_back(len_k);
    TORCH_CHECK(weights->sizes() == at::IntArrayRef(weights_shape), kSdpa,
                " backward: weights has shape ", shape_str(weights->sizes()), ", expected ",
                shape_str(weights_shape));
    TORCH_CHECK(weights->scalar_type() == output.scalar_type(), kSdpa,
                " backward: weights has dtype ", weights->scalar_type(), ", expected ",
                output.scalar_type());
  }
  TORCH_CHECK(logsumexp.sizes() == at::IntArrayRef(out_shape), kSdpa,
              " backward: logsumexp has shape ", shape_str(logsumexp.sizes()), ", expected ",
              shape_str(out_shape));
  for (const auto& [t, name] : {std::pair{&grad_output, "grad_output"},
                                std::pair{&logsumexp, "logsumexp"}}) {
    TORCH_CHECK(t->device() == output.device(), kSdpa, " backward: ", name, " is on ",
                t->device(), " but output is on ", output.device());
  }
  if (weights && weights->numel() > 0) {
    TORCH_CHECK(weights->device() == output.device(), kSdpa, " backward: weights is on ",
                weights->device(), " but output is on ", output.device());
  }
  // Half-precision inputs keep their log-sum-exp in float32 (the CUDA kernels).
  const auto lse_dtype = at::isReducedFloatingType(output.scalar_type()) ? at::kFloat
                                                                          : output.scalar_type();
  TORCH_CHECK(logsumexp.scalar_type() == lse_dtype, kSdpa, " backward: logsumexp has dtype ",
              logsumexp.scalar_type(), ", expected ", lse_dtype);
  out_shape.push_back(dim_v);
  for (const auto& [t, name] :
       {std::pair{&grad_output, "grad_output"}, std::pair{&output, "output"}}) {
    TORCH_CHECK(t->sizes() == at::IntArrayRef(out_shape), kSdpa, " backward: ", name,
                " has shape ", shape_str(t->sizes()), ", expected ", shape_str(out_shape));
    TORCH_CHECK(t->scalar_type() == output.scalar_type(), kSdpa, " backward: ", name,
                " has dtype ", t->scalar_type(), ", expected ", output.scalar_type());
  }
}

void additive_scores_kinds(const at::Tensor& query_proj, const at::Tensor& key_proj,
                           const at::Tensor& weight) {
  torch_compatible(kOp);
  for (const auto& [t, name, rank] : {std::tuple{&query_proj, "query_proj", 3},
                                      std::tuple{&key_proj, "key_proj", 3},
                                      std::tuple{&weight, "weight", 1}}) {
    TORCH_CHECK(t->defined(), kOp, ": ", name, " is an undefined tensor");
    TORCH_CHECK(t->dim() == rank, kOp, ": ", name, " must have ", rank,
                rank == 3 ? " dimensions [batch, length, hidden]" : " dimension [hidden]",
                ", got shape ", shape_str(t->sizes()));
    if (t->is_cuda()) {
      TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kHalf ||
                      t->scalar_type() == at::kBFloat16,
                  kOp, ": ", name, " must be float32, float16 or bfloat16 on CUDA, got ",
                  t->scalar_type());
    } else {
      TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == at::kDouble, kOp, ": ",
                  name, " must be float32 or float64, got ", t->scalar_type());
    }
    TORCH_CHECK(t->scalar_type() == query_proj.scalar_type(), kOp, ": ", name, " has dtype ",
                t->scalar_type(), " but query_proj has ", query_proj.scalar_type());
    TORCH_CHECK(t->device() == query_proj.device(), kOp, ": ", name, " is on ", t->device(),
                " but query_proj is on ", query_proj.device());
  }
}

void additive_scores_inputs(const at::Tensor& query_proj, const at::Tensor& key_proj,
                            const at::Tensor& weight) {
  additive_scores_kinds(query_proj, key_proj, weight);
  TORCH_CHECK(key_proj.size(0) == query_proj.size(0), kOp, ": key_proj has batch size ",
              key_proj.size(0), " but query_proj has ", query_proj.size(0));
  TORCH_CHECK(key_proj.size(2) == query_proj.size(2), kOp, ": key_proj has hidden size ",
              key_proj.size(2), " but query_proj has ", query_proj.size(2));
  TORCH_CHECK(weight.size(0) == query_proj.size(2), kOp, ": weight has ", weight.size(0),
              " entries but the hidden size is ", query_proj.size(2));
}

}  // namespace attnlab::checks

namespace attnlab::checks {
namespace {

constexpr const char* kBlock = "attnlab.encoder_block";
constexpr const char* kBlockParams[] = {"qkv_weight", "qkv_bias",     "out_weight", "out_bias",
                                        "norm1_weight", "norm1_bias", "ff1_weight", "ff1_bias",
                                        "ff2_weight",   "ff2_bias",   "norm2_weight",
                                        "norm2_bias"};

}  // namespace

void encoder_block_kinds(const at::Tensor& x, at::TensorList params,
                         const std::optional<at::Tensor>& attn_mask) {
  torch_compatible(kBlock);
  TORCH_CHECK(x.defined(), kBlock, ": x is an undefined tensor");
  TORCH_CHECK(x.dim() == 3, kBlock, ": x must have shape [batch, length, dim], got shape ",
              shape_str(x.sizes()));
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ||
                  x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              kBlock, ": x must be float32, float64, float16 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.device().is_cpu(), kBlock, ": runs on the CPU only, x is on ", x.device());
  TORCH_CHECK(params.size() == std::size(kBlockParams), kBlock, ": expected ",
              std::size(kBlockParams), " parameter tensors, got ", params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    TORCH_CHECK(p.defined(), kBlock, ": ", kBlockParams[i], " is an undefined tensor");
    TORCH_CHECK(p.scalar_type() == x.scalar_type() && p.device() == x.device(), kBlock, ": ",
                kBlockParams[i], " is ", p.scalar_type(), " on ", p.device(), " but x is ",
                x.scalar_type(), " on ", x.device());
  }
  mask_kind(kBlock, attn_mask, x, "x");
}

void encoder_block_inputs(const at::Tensor& x, at::TensorList params, int64_t num_heads,
                          const std::optional<at::Tensor>& attn_mask, double norm1_eps,
                          double norm2_eps) {
  encoder_block_kinds(x, params, attn_mask);
  const int64_t batch = x.size(0), length = x.size(1), dim = x.size(2);
  TORCH_CHECK(num_heads > 0 && dim % num_heads == 0, kBlock, ": num_heads (", num_heads,
              ") must be positive and divide the width of x (", dim, ")");
  const int64_t dim_ff = params[6].dim() == 2 ? params[6].size(0) : -1;
  TORCH_CHECK(dim_ff > 0, kBlock, ": ff1_weight must have shape [dim_feedforward, ", dim,
              "] with dim_feedforward > 0, got ", shape_str(params[6].sizes()));
  const std::vector<std::vector<int64_t>> expected{
      {3 * dim, dim}, {3 * dim}, {dim, dim}, {dim},  {dim}, {dim},
      {dim_ff, dim},  {dim_ff},  {dim, dim_ff}, {dim}, {dim}, {dim}};
  for (size_t i = 0; i < params.size(); ++i) {
    TORCH_CHECK(params[i].sizes() == at::IntArrayRef(expected[i]), kBlock, ": ",
                kBlockParams[i], " must have shape ", shape_str(expected[i]), " for x of width ",
                dim, ", got ", shape_str(params[i].sizes()));
  }
  if (attn_mask && attn_mask->defined()) {
    const std::vector<int64_t> full{batch, num_heads, length, length};
    const auto shape = broadcast(full, attn_mask->sizes());
    TORCH_CHECK(shape && *shape == full, kBlock, ": attn_mask of shape ",
                shape_str(attn_mask->sizes()), " does not broadcast to [batch, heads, length, "
                "length] = ", shape_str(full));
  }
  for (const double eps : {norm1_eps, norm2_eps}) {
    TORCH_CHECK(std::isfinite(eps) && eps >= 0, kBlock, ": LayerNorm eps must be a finite "
                "number >= 0, got ", eps);
  }
}

}  // namespace attnlab::checks

namespace attnlab::checks {

void dropout(double dropout_p) {
  TORCH_CHECK(std::isfinite(dropout_p) && dropout_p >= 0 && dropout_p < 1, kSdpa,
              ": dropout_p must be a probability in [0, 1), got ", dropout_p);
}

void sparse_alpha(double alpha) {
  TORCH_CHECK(std::isfinite(alpha) && alpha > 1, kSdpa,
              ": alpha must be a finite number > 1 (2 is sparsemax, 1.5 entmax-1.5; alpha -> 1 "
              "approaches softmax, normalizer=\"softmax\"), got ", alpha);
}

void sparse_sdpa_backward_inputs(const at::Tensor& grad_output, const at::Tensor& output,
                                 const at::Tensor& tau, const at::Tensor& support_value,
                                 const std::optional<at::Tensor>& weights,
                                 at::IntArrayRef batch_shape, int64_t len_q, int64_t len_k,
                                 int64_t dim_v) {
  // The rules of the softmax backward, with tau in the place of the log-sum-exp, and
  // support_value shaped like the output and typed like tau.
  std::vector<int64_t> row_shape(batch_shape.begin(), batch_shape.end());
  row_shape.push_back(len_q);
  auto out_shape = row_shape;
  out_shape.push_back(dim_v);
  const auto dtype = output.scalar_type();
  // Half-precision inputs keep tau in float32 (as the log-sum-exp of the softmax kernels).
  const auto tau_dtype = at::isReducedFloatingType(dtype) ? at::kFloat : dtype;
  for (const auto& [t, name, shape, type] :
       {std::tuple{&grad_output, "grad_output", &out_shape, dtype},
        std::tuple{&output, "output", &out_shape, dtype},
        std::tuple{&support_value, "support_value", &out_shape, tau_dtype},
        std::tuple{&tau, "tau", &row_shape, tau_dtype}}) {
    TORCH_CHECK(t->defined(), kSdpa, " backward: ", name, " is an undefined tensor");
    TORCH_CHECK(t->sizes() == at::IntArrayRef(*shape), kSdpa, " backward: ", name,
                " has shape ", shape_str(t->sizes()), ", expected ", shape_str(*shape));
    TORCH_CHECK(t->scalar_type() == type, kSdpa, " backward: ", name, " has dtype ",
                t->scalar_type(), ", expected ", type);
    TORCH_CHECK(t->device() == output.device(), kSdpa, " backward: ", name, " is on ",
                t->device(), " but output is on ", output.device());
  }
  if (weights && weights->numel() > 0) {
    auto weights_shape = row_shape;
    weights_shape.push_back(len_k);
    TORCH_CHECK(weights->sizes() == at::IntArrayRef(weights_shape), kSdpa,
                " backward: weights has shape ", shape_str(weights->sizes()), ", expected ",
                shape_str(weights_shape));
    TORCH_CHECK(weights->scalar_type() == dtype, kSdpa, " backward: weights has dtype ",
                weights->scalar_type(), ", expected ", dtype);
    TORCH_CHECK(weights->device() == output.device(), kSdpa, " backward: weights is on ",
                weights->device(), " but output is on ", output.device());
  }
}

}  // namespace attnlab::checks
