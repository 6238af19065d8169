"""The transformers backend across architectures: tiny configs with random weights, each run
with attn_implementation="attnlab" and "eager" on the same weights and a right-padded batch,
in training mode, without and with attention dropout. The hidden states, the attentions and the
gradients must agree."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
import attnlab.integrations.transformers  # noqa: E402,F401  (registers "attnlab")
from attnlab import functional  # noqa: E402

COMMON = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=48, max_position_embeddings=64)
# model_type: extra config keywords (grouped-query and sliding-window ones among them).
ARCHITECTURES = {
    "bert": {}, "roberta": {}, "electra": dict(embedding_size=32), "distilbert":
    dict(dim=32, n_layers=2, n_heads=4, hidden_dim=48), "gpt2": {}, "gpt_neox": {},
    "gptj": dict(rotary_dim=4), "opt": dict(ffn_dim=48, word_embed_proj_dim=32),
    "llama": dict(num_key_value_heads=2), "mistral": dict(num_key_value_heads=2,
                                                          sliding_window=5),
    "qwen2": dict(num_key_value_heads=2), "gemma": dict(num_key_value_heads=1, head_dim=8),
    "phi": {}, "stablelm": dict(num_key_value_heads=4), "olmo": {}, "falcon": {}, "starcoder2": dict(num_key_value_heads=2),
}
LENGTH, LENGTHS = 9, (9, 6, 3)


ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout")


def build(model_type, implementation, attention_dropout=0.0):
    """The model with every dropout 0 but the attention weights' (attention_dropout)."""
    config = transformers.AutoConfig.for_model(model_type, **COMMON,
                                               **ARCHITECTURES[model_type])
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attn_pdrop",
                 "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout", "dropout"):
        if hasattr(config, name):
            setattr(config, name, attention_dropout if name in ATTENTION_DROPOUT else 0.0)
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config, attn_implementation=implementation)


def padded_batch():
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, COMMON["vocab_size"], (len(LENGTHS), LENGTH), generator=gen)
    mask = torch.zeros(len(LENGTHS), LENGTH, dtype=torch.long)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    return ids, mask


def run(model, ids, mask):
    """Hidden states and attentions, and the gradients of a loss on both (at the real tokens)."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    hidden = out.last_hidden_state
    weights = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(2))
    loss = (hidden * weights)[mask.bool()].sum()
    gen = torch.Generator().manual_seed(3)
    for attention in out.attentions:
        # only the rows of real tokens: a padded query's row is a convention of each backend
        rows = mask.bool()[:, None, :, None].expand_as(attention)
        loss = loss + (attention * torch.randn(attention.shape, generator=gen))[rows].sum()
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), [a.detach() for a in out.attentions], grads


def attnlab_masks_in_eager(monkeypatch):
    """Eager's dropout on attention weights (the 4-D tensors it drops) draws attnlab's mask,
    from the seed attnlab's call would draw at the same point of torch's generator: the two
    backends then drop the same weights, and their results can be compared."""
    original = torch.nn.functional.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if input.dim() != 4 or not training or p == 0:
            return original(input, p, training, inplace)
        mask = functional.dropout_mask(input.shape, p, functional.dropout_seed(),
                                       dtype=input.dtype)
        return input.mul_(mask) if inplace else input * mask

    monkeypatch.setattr(torch.nn.functional, "dropout", dropout)


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_architecture_matches_eager(model_type, attention_dropout, one_thread, monkeypatch):
    eager = build(model_type, "eager", attention_dropout)
    ours = build(model_type, "attnlab", attention_dropout)
    ours.load_state_dict(eager.state_dict())
    ids, mask = padded_batch()
    real = mask.bool()
    torch.manual_seed(5)
    hidden, attentions, grads = run(ours.train(), ids, mask)
    attnlab_masks_in_eager(monkeypatch)
    torch.manual_seed(5)
    ref_hidden, ref_attentions, ref_grads = run(eager.train(), ids, mask)
    if attention_dropout:
        # The dropout acted: rows of real tokens whose weights no longer sum to 1.
        assert any((a.sum(-1) - 1).abs()[real[:, None, :].expand(a.shape[:-1])].max() > 1e-3
                   for a in attentions), "no weight was dropped"
    scale = ref_hidden.abs().max()
    assert (hidden - ref_hidden)[real].abs().max() <= 1e-5 * scale
    assert len(attentions) == len(ref_attentions) == COMMON["num_hidden_layers"]
    for mine, theirs in zip(attentions, ref_attentions):
        rows = real[:, None, :, None].expand_as(mine)
        assert (mine - theirs)[rows].abs().max() <= 1e-5
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        reference = ref_grads[name]
        assert (grad - reference).abs().max() <= 1e-4 * max(reference.abs().max(), 1e-3), name
