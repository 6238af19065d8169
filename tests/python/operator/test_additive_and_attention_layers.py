"""The additive-scores operator and the attention layers of the permutation-composition lab."""

import math

import pytest
import torch

from attnlab.nn import (AdditiveAttention, MultiplicativeAttention, ScaledDotProductAttention,
                        autoregressive_mask)


def reference_additive(query_proj, key_proj, weight):
    t = torch.tanh(query_proj.double()[:, :, None, :] + key_proj.double()[:, None, :, :])
    return (t * weight.double()).sum(-1)


@pytest.mark.parametrize("shape", [(2, 5, 7, 16), (1, 1, 1, 1), (3, 9, 4, 33), (2, 40, 30, 64)])
def test_additive_scores_match_reference(shape):
    B, Q, K, h = shape
    gen = torch.Generator().manual_seed(sum(shape))
    qp, kp = torch.randn(B, Q, h, generator=gen), torch.randn(B, K, h, generator=gen)
    w = torch.randn(h, generator=gen)
    out = torch.ops.attnlab.additive_scores(qp, kp, w)
    # float32 tanh is accurate to about 1e-7 absolute per term; h terms add up.
    torch.testing.assert_close(out.double(), reference_additive(qp, kp, w), rtol=1e-5,
                               atol=1e-6 * math.sqrt(h))


def test_additive_scores_gradcheck():
    gen = torch.Generator().manual_seed(0)
    make = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)  # noqa: E731
    assert torch.autograd.gradcheck(torch.ops.attnlab.additive_scores,
                                     (make(2, 3, 5), make(2, 4, 5), make(5)))


def test_additive_scores_float32_gradients_match_reference():
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(*s, generator=gen, requires_grad=True) for s in ((3, 6, 8), (3, 7, 8), (8,))]
    grad = torch.randn(3, 6, 7, generator=gen)
    grads = torch.autograd.grad(torch.ops.attnlab.additive_scores(*inputs), inputs, grad)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(reference_additive(*ref_inputs), ref_inputs, grad.double())
    for got, ref in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)


def test_additive_scores_opcheck():
    args = (torch.randn(2, 3, 5, requires_grad=True), torch.randn(2, 4, 5, requires_grad=True),
            torch.randn(5, requires_grad=True))
    torch.library.opcheck(torch.ops.attnlab.additive_scores.default, args)
    plain = tuple(t.detach() for t in args)
    torch.library.opcheck(torch.ops.attnlab._additive_scores_forward.default, plain)
    torch.library.opcheck(torch.ops.attnlab._additive_scores_backward.default,
                          (torch.randn(2, 3, 4), *plain))


ADDITIVE_BAD = [
    (dict(query_proj=torch.randn(3, 5)), r"query_proj must have 3 dimensions \[batch, length, hidden\]"),
    (dict(key_proj=torch.randn(3, 4, 6)), r"key_proj has batch size 3 but query_proj has 2"),
    (dict(key_proj=torch.randn(2, 4, 7)), r"key_proj has hidden size 7 but query_proj has 6"),
    (dict(weight=torch.randn(5)), r"weight has 5 entries but the hidden size is 6"),
    (dict(weight=torch.randn(6, dtype=torch.float64)), r"weight has dtype Double but query_proj has Float"),
    (dict(query_proj=torch.ones(2, 3, 6, dtype=torch.int32)), r"query_proj must be float32 or float64"),
]


@pytest.mark.parametrize("overrides,message", ADDITIVE_BAD)
def test_additive_scores_bad_input(overrides, message):
    args = dict(query_proj=torch.randn(2, 3, 6), key_proj=torch.randn(2, 4, 6),
                weight=torch.randn(6)) | overrides
    with pytest.raises(RuntimeError, match=message):
        torch.ops.attnlab.additive_scores(args["query_proj"], args["key_proj"], args["weight"])


def test_additive_attention_layer_matches_equations():
    torch.manual_seed(2)
    layer = AdditiveAttention(obj_feature_dim=6, query_feature_dim=4, hidden_dim=10).double()
    features = torch.randn(2, 7, 6, dtype=torch.float64)
    queries = torch.randn(2, 5, 4, dtype=torch.float64)
    mask = autoregressive_mask(7)[:5]
    scores = layer.get_scores(features, queries)
    ref_scores = reference_additive(layer.W1(queries), layer.W2(features), layer.w3.weight[0])
    torch.testing.assert_close(scores, ref_scores, rtol=1e-12, atol=1e-12)
    out = layer.attend(features, queries, mask=mask)
    weights = torch.softmax(ref_scores.masked_fill(~mask, float("-inf")), dim=-1)
    torch.testing.assert_close(layer.last_weights, weights, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, weights @ features, rtol=1e-12, atol=1e-12)
    assert not layer.last_weights.requires_grad
    params = list(layer.parameters())
    assert torch.autograd.gradcheck(lambda f, q: layer.attend(f, q, mask),
                                     (features.requires_grad_(), queries.requires_grad_()))
    assert all(p.requires_grad for p in params)


@pytest.mark.parametrize("cls,scale", [(ScaledDotProductAttention, None), (MultiplicativeAttention, 1.0)])
def test_dot_product_layers(cls, scale):
    layer = cls()
    features, queries = torch.randn(2, 6, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    s = 1 / math.sqrt(8) if scale is None else scale
    expected_scores = queries @ features.transpose(1, 2) * s
    torch.testing.assert_close(layer.get_scores(features, queries), expected_scores)
    out = layer.attend(features, queries)
    weights = torch.softmax(expected_scores, dim=-1)
    torch.testing.assert_close(layer.last_weights, weights)
    torch.testing.assert_close(out, weights @ features)
    with pytest.raises(ValueError, match=r"queries have 5 features but the objects have 8"):
        layer.attend(features, torch.randn(2, 3, 5, dtype=torch.float64))


def test_autoregressive_mask_and_bad_arguments():
    assert torch.equal(autoregressive_mask(3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    assert torch.equal(AdditiveAttention.get_autoregressive_mask(4), autoregressive_mask(4))
    with pytest.raises(ValueError, match=r"hidden_dim must be positive, got 0"):
        AdditiveAttention(4, 4, 0)
    with pytest.raises(ValueError, match=r"features have batch size 2 but queries have 3"):
        ScaledDotProductAttention().attend(torch.randn(2, 4, 8), torch.randn(3, 4, 8))
