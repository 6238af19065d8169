"""Code written for torch.nn.functional.scaled_dot_product_attention: its keywords
(``enable_gqa``, ``dropout_p``) mean the same here, arguments of the wrong kind raise a
TypeError naming them, and torch.jit.script compiles callers."""

import pytest
import torch

import attnlab
from reference import NORMALIZERS, assert_close, attention, ids


def _grouped_inputs(dtype=torch.float64, heads=6, kv_heads=2, requires_grad=False):
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(2, heads, 5, 8, generator=generator, dtype=dtype)
    k = torch.randn(2, kv_heads, 7, 8, generator=generator, dtype=dtype)
    v = torch.randn(2, kv_heads, 7, 3, generator=generator, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _repeated(t, heads):
    """torch's GQA: query head h uses key/value head h // (heads / kv_heads)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


MASKS = {
    "none": None,
    "per_query_head": torch.rand(2, 6, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3,
    "one_head": torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(2)) > 0.3,
    "rows_keys": torch.rand(5, 7, generator=torch.Generator().manual_seed(3)) > 0.3,
    "additive": torch.randn(2, 6, 5, 7, generator=torch.Generator().manual_seed(4),
                            dtype=torch.float64),
}


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("normalizer,alpha", NORMALIZERS[:3], ids=ids(NORMALIZERS[:3]))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_enable_gqa_shares_key_value_heads_as_torch_defines_it(mask_name, normalizer, alpha,
                                                               dtype):
    q, k, v = _grouped_inputs(dtype)
    mask = MASKS[mask_name]
    if mask is not None and mask.is_floating_point():
        mask = mask.to(dtype)
    out, weights = attnlab.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=True, need_weights=True, normalizer=normalizer,
        alpha=alpha, enable_gqa=True)
    ref_out, ref_weights = attention(q, _repeated(k, 6), _repeated(v, 6), mask, True,
                                     normalizer=normalizer, alpha=alpha)
    assert_close(out, ref_out, "output", dtype)
    assert_close(weights, ref_weights, "weights", dtype)


def test_enable_gqa_matches_torch_and_its_gradients_pass_gradcheck():
    q, k, v = _grouped_inputs(requires_grad=True)
    out, _ = attnlab.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert_close(out, expected, "output", torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v: attnlab.scaled_dot_product_attention(q, k, v, enable_gqa=True)[0],
        (q, k, v))


def test_enable_gqa_with_equal_heads_is_plain_attention():
    q, k, v = _grouped_inputs(heads=2)
    plain, _ = attnlab.scaled_dot_product_attention(q, k, v)
    grouped, _ = attnlab.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.equal(plain, grouped)


def test_enable_gqa_with_heads_that_do_not_divide_is_named():
    q, k, v = _grouped_inputs(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="enable_gqa=True: query has 6 heads, key 4"):
        attnlab.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_dropout_p_zero_changes_nothing_and_bad_values_are_named():
    q, k, v = _grouped_inputs(heads=2)
    plain, _ = attnlab.scaled_dot_product_attention(q, k, v)
    out, _ = attnlab.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(plain, out)
    out, _ = attnlab.scaled_dot_product_attention(q, k, v, dropout_p=0)
    assert torch.equal(plain, out)
    with pytest.raises(TypeError, match="dropout_p must be a number"):
        attnlab.scaled_dot_product_attention(q, k, v, dropout_p="0.1")
    for bad in (1.0, -0.1, float("nan"), 1.5):
        with pytest.raises(ValueError, match=r"dropout_p must be a probability in \[0, 1\)"):
            attnlab.scaled_dot_product_attention(q, k, v, dropout_p=bad)


@pytest.mark.parametrize("argument,value,message", [
    ("query", [[1.0]], "query must be a torch.Tensor, got list"),
    ("key", 3, "key must be a torch.Tensor, got int"),
    ("value", None, "value must be a torch.Tensor, got NoneType"),
    ("attn_mask", "causal", "attn_mask must be a torch.Tensor or None, got str"),
    ("is_causal", "yes", "is_causal must be a bool, got str"),
    ("need_weights", None, "need_weights must be a bool, got NoneType"),
    ("enable_gqa", 1, "enable_gqa must be a bool, got int"),
    ("scale", "0.5", "scale must be a number or None, got str"),
])
def test_an_argument_of_the_wrong_kind_is_a_type_error_naming_it(argument, value, message):
    q, k, v = _grouped_inputs(heads=2)
    arguments = dict(query=q, key=k, value=v)
    arguments[argument] = value
    with pytest.raises(TypeError, match=message):
        attnlab.scaled_dot_product_attention(**arguments)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torch_jit_script_compiles_a_caller():
    def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attnlab.scaled_dot_product_attention(q, k, v, is_causal=True)[0]

    scripted = torch.jit.script(causal_attention)
    q, k, v = _grouped_inputs(heads=2)
    assert torch.equal(scripted(q, k, v), causal_attention(q, k, v))


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_torch_jit_script_keeps_dropout_and_its_seed():
    def dropped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        return attnlab.scaled_dot_product_attention(q, k, v, dropout_p=p)[0]

    scripted = torch.jit.script(dropped)
    q, k, v = _grouped_inputs(heads=2)
    torch.manual_seed(3)
    expected = dropped(q, k, v, 0.5)
    torch.manual_seed(3)
    assert torch.equal(scripted(q, k, v, 0.5), expected)
    assert not torch.equal(expected, dropped(q, k, v, 0.0))
