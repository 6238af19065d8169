"""attnlab.interpret.summarize: every attention call's summaries from the fused kernel, in
attnlab's modules and in Hugging Face models, against reductions of the full weights."""

import pytest
import torch

import attnlab
import attnlab.integrations.transformers  # noqa: F401  (registers attn_implementation)
from attnlab import WeightSummary, functional
from attnlab.interpret import summarize

transformers = pytest.importorskip("transformers")

SUMMARY = WeightSummary(received=True, entropy=True, topk=4, pool=8, to=(0,))


def reductions(weights):
    """The summaries of SUMMARY from full weights [..., L_q, L_k], in torch ops."""
    w = weights.double()
    pooled = torch.nn.functional.avg_pool2d(w.flatten(0, -3).unsqueeze(1), 8, ceil_mode=True)
    return {"received": w.sum(-2), "entropy": torch.special.entr(w).sum(-1),
            "topk_weights": w.topk(4, dim=-1).values,
            "pooled": pooled.squeeze(1).unflatten(0, w.shape[:-2]), "to": w[..., :1]}


def assert_matches(summary, weights, what):
    for name, expected in reductions(weights).items():
        actual = getattr(summary, name).double()
        assert actual.shape == expected.shape, f"{what} {name}: {actual.shape} != {expected.shape}"
        scale = max(1.0, expected.abs().max().item())
        error = (actual - expected).abs().max().item()
        assert error <= 1e-5 * scale, f"{what} {name}: max error {error:.3g}"


def llama(implementation):
    config = transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config, attn_implementation=implementation).eval()


def test_a_hugging_face_model_gives_every_layer_s_summaries_without_its_weights(one_thread):
    eager, ours = llama("eager"), llama("attnlab")
    ours.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 100, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = eager(input_ids=ids, output_attentions=True)
        plain = ours(input_ids=ids)
        with summarize(SUMMARY) as collected:
            out = ours(input_ids=ids)
    assert len(collected) == 3
    for layer, (summary, weights) in enumerate(zip(collected, reference.attentions)):
        assert_matches(summary, weights, f"layer {layer}")
    assert collected.stack("entropy").shape == (3, 2, 4, 37)
    torch.testing.assert_close(out.last_hidden_state, plain.last_hidden_state, rtol=1e-5,
                               atol=1e-5)
    assert not functional.has_attention_hooks()


def test_a_caller_that_asks_for_weights_still_gets_them(one_thread):
    model = llama("attnlab")
    ids = torch.randint(0, 100, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), summarize(received=True) as collected:
        out = model(input_ids=ids, output_attentions=True)
    assert len(out.attentions) == len(collected) == 3
    for summary, weights in zip(collected, out.attentions):
        torch.testing.assert_close(summary.received, weights.sum(-2), rtol=1e-5, atol=1e-6)
        assert summary.entropy is None


def test_attnlab_modules_and_their_gradients(one_thread):
    layer = attnlab.nn.MultiheadAttention(16, 16, 2)
    x = torch.randn(3, 11, 16, requires_grad=True)
    with summarize(SUMMARY) as collected:
        out, weights = layer(x, return_attention=True)
    out.sum().backward()  # the output keeps its gradient
    assert x.grad is not None and len(collected) == 1
    assert_matches(collected[0], weights.detach(), "MultiheadAttention")


def test_summarize_refuses_a_bad_request():
    with pytest.raises(ValueError, match="at least one summary"):
        summarize()
    with pytest.raises(TypeError, match="not both"):
        summarize(SUMMARY, entropy=True)
    with summarize(entropy=True) as collected:
        pass
    with pytest.raises(ValueError, match="no attention call"):
        collected.stack("entropy")
    with pytest.raises(ValueError, match="unknown summary"):
        collected.stack("mean")
