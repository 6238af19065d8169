"""summary= in attnlab's modules: MultiheadAttention returns the summaries of its weights, the
encoder one per layer, each equal to the same reduction of the module's own weights."""

import pytest
import torch

from attnlab import WeightSummary
from attnlab.nn import MultiheadAttention, TransformerEncoder

SUMMARY = WeightSummary(received=True, entropy=True, topk=3, pool=4)


def assert_reduces(summary, weights):
    w = weights.double()
    expected = {"received": w.sum(-2), "entropy": torch.special.entr(w).sum(-1),
                "topk_weights": w.topk(3, dim=-1).values}
    for name, value in expected.items():
        torch.testing.assert_close(getattr(summary, name).double(), value, rtol=0, atol=1e-5,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert summary.pooled.shape == weights.shape[:-2] + (3, 3)


@pytest.mark.parametrize("normalizer", ["softmax", "entmax15"])
def test_multihead_attention_returns_the_summaries_of_its_weights(normalizer):
    layer = MultiheadAttention(16, 16, 2, normalizer=normalizer).eval()
    x = torch.randn(3, 11, 16)
    mask = torch.rand(11, 11) > 0.3
    mask.fill_diagonal_(True)
    with torch.no_grad():
        out, weights = layer(x, mask, return_attention=True)
        out_s, summary = layer(x, mask, summary=SUMMARY)
    torch.testing.assert_close(out_s, out, rtol=1e-5, atol=1e-6)
    assert_reduces(summary, weights)
    with pytest.raises(ValueError, match="summary= replaces the weights"):
        layer(x, return_attention=True, summary=SUMMARY)


def test_encoder_gives_one_summary_per_layer():
    encoder = TransformerEncoder(3, input_dim=16, num_heads=4, dim_feedforward=32).eval()
    x = torch.randn(2, 10, 16)
    with torch.no_grad():
        out, maps = encoder.forward_with_attention(x)
        out_s, summaries = encoder.forward_with_summaries(x, SUMMARY)
    torch.testing.assert_close(out_s, out, rtol=1e-5, atol=1e-6)
    assert len(summaries) == 3
    for summary, weights in zip(summaries, maps):
        assert_reduces(summary, weights)
