"""Bad input raises a Python exception whose message names the argument and what was expected."""

import math

import pytest
import torch

import attnlab

q = torch.randn(2, 4, 8)
k = torch.randn(2, 5, 8)
v = torch.randn(2, 5, 3)

CASES = {
    "query rank 1": (dict(query=torch.randn(8)), r"query must have at least 2 dimensions"),
    "key rank 0": (dict(key=torch.tensor(1.0)), r"key must have at least 2 dimensions"),
    "feature mismatch": (dict(key=torch.randn(2, 5, 7)), r"key has 7 features per position but query has 8"),
    "zero features": (dict(query=torch.randn(2, 4, 0), key=torch.randn(2, 5, 0)), r"query must have at least one feature"),
    "key/value length mismatch": (dict(value=torch.randn(2, 6, 3)), r"value has 6 positions but key has 5"),
    "batch dims of key": (dict(key=torch.randn(3, 5, 8), value=torch.randn(3, 5, 3)), r"batch dimensions of query \[2\] and key \[3\] are not broadcastable"),
    "batch dims of value": (dict(value=torch.randn(3, 5, 3)), r"batch dimensions of value \[3\]"),
    "mask not broadcastable": (dict(attn_mask=torch.ones(4, 6, dtype=torch.bool)), r"attn_mask of shape \[4, 6\] is not broadcastable to the attention weights' shape \[2, 4, 5\]"),
    "mask with extra batch dims": (dict(attn_mask=torch.ones(3, 2, 4, 5, dtype=torch.bool)), r"attn_mask of shape \[3, 2, 4, 5\]"),
    "integer mask": (dict(attn_mask=torch.ones(4, 5, dtype=torch.int32)), r"attn_mask must be bool .* or floating point .*got Int"),
    "integer query": (dict(query=torch.ones(2, 4, 8, dtype=torch.int64)), r"query must be float32, float64, float16 or bfloat16 on the CPU, got Long"),
    "half value, float query": (dict(value=v.half()), r"value has dtype Half but query has Float"),
    "bfloat16 key, float16 query": (dict(query=torch.randn(2, 4, 8).half(), key=k.bfloat16(), value=v.half()), r"key has dtype BFloat16 but query has Half"),
    "int8 query": (dict(query=torch.ones(2, 4, 8, dtype=torch.int8)), r"query must be float32, float64, float16 or bfloat16 on the CPU, got Char"),
    "mixed dtypes": (dict(key=k.double()), r"key has dtype Double but query has Float"),
    "different devices": (dict(value=torch.empty(2, 5, 3, device="meta")), r"value is on meta but query is on cpu"),
    "mask on another device": (dict(attn_mask=torch.empty(4, 5, device="meta")), r"attn_mask is on meta but query is on cpu"),
    "nan scale": (dict(scale=math.nan), r"scale must be a finite number, got nan"),
    "infinite scale": (dict(scale=math.inf), r"scale must be a finite number, got inf"),
    "unknown normalizer": (dict(normalizer="relu"), r'unknown normalizer "relu"; expected one of "softmax", "sparsemax", "entmax15" or "entmax"'),
    "alpha without entmax": (dict(normalizer="entmax15", alpha=1.5), r'alpha is only taken by normalizer="entmax"'),
    "entmax without alpha": (dict(normalizer="entmax"), r'normalizer="entmax" needs alpha'),
    "entmax alpha 1": (dict(normalizer="entmax", alpha=1.0), r"alpha must be a finite number > 1 .*got 1"),
    "entmax alpha nan": (dict(normalizer="entmax", alpha=math.nan), r"alpha must be a finite number > 1 .*got nan"),
    "sparsemax of mismatched features": (dict(normalizer="sparsemax", key=torch.randn(2, 5, 7)), r"key has 7 features per position but query has 8"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_raises_clear_error(name):
    overrides, message = CASES[name]
    args = dict(query=q, key=k, value=v) | overrides
    with pytest.raises(RuntimeError, match=message) as info:
        attnlab.scaled_dot_product_attention(**args)
    assert "attnlab.scaled_dot_product_attention" in str(info.value)


def test_boolean_mask_gradient_requested_directly_is_refused():
    output, lse, _ = torch.ops.attnlab._sdpa_forward(q, k, v, None, False, None, False)
    with pytest.raises(RuntimeError, match=r"a boolean attn_mask has no gradient"):
        torch.ops.attnlab._sdpa_backward(torch.ones_like(output), q, k, v,
                                         torch.ones(4, 5, dtype=torch.bool), False, None,
                                         output, lse, None, True)


def test_errors_also_raised_through_torch_ops():
    with pytest.raises(RuntimeError, match=r"value has 6 positions but key has 5"):
        torch.ops.attnlab.scaled_dot_product_attention(q, k, torch.randn(2, 6, 3))
