"""The transformers backend across architectures: tiny configs with random weights, each run
with attn_implementation="attnlab" and "eager" on the same weights and a right-padded batch,
in training mode, without and with attention dropout. The hidden states, the attentions and the
gradients must agree. Pix2Struct's vision encoder (padded patches) and PatchTST (time series)
take other inputs; LongT5 and Pix2Struct's text decoder are refused, with the reason."""

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
# Vision encoders (16 × 16 images in 4 × 4 patches, and a class token) and an
# encoder-decoder (its encoder's, decoder's and cross-attention maps all compared).
OTHER_ARCHITECTURES = {
    "vit": dict(image_size=16, patch_size=4), "deit": dict(image_size=16, patch_size=4),
    "bart": dict(encoder_layers=2, decoder_layers=2, decoder_attention_heads=4,
                 encoder_ffn_dim=48, decoder_ffn_dim=48),
}
LENGTH, LENGTHS = 9, (9, 6, 3)


ATTENTION_DROPOUT = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout")


def build(model_type, implementation, attention_dropout=0.0):
    """The model with every dropout 0 but the attention weights' (attention_dropout)."""
    config = transformers.AutoConfig.for_model(
        model_type, **COMMON, **{**ARCHITECTURES, **OTHER_ARCHITECTURES}[model_type])
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


def run(model, inputs, real):
    """Hidden states and attentions, and the gradients of a loss on both (at the real positions).
    real: [N, L], True at real tokens, N being the batch of the attentions (PatchTST's is
    batch x channels, which its hidden states [batch, channels, L, d] are reshaped to)."""
    model.zero_grad(set_to_none=True)
    out = model(**inputs, output_attentions=True)
    hidden = out.last_hidden_state.reshape(*real.shape, -1)
    # every map the model returns (an encoder-decoder's encoder, decoder and cross-attentions)
    maps = [a for name, value in out.items() if name.endswith("attentions") for a in value]
    weights = torch.randn(hidden.shape[-1], generator=torch.Generator().manual_seed(2))
    loss = (hidden * weights)[real].sum()
    gen = torch.Generator().manual_seed(3)
    for attention in maps:
        # only the rows of real tokens: a padded query's row is a convention of each backend
        rows = real[:, None, :, None].expand_as(attention)
        loss = loss + (attention * torch.randn(attention.shape, generator=gen))[rows].sum()
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), [a.detach() for a in maps], grads


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


def assert_matches_eager(eager, ours, inputs, real, attention_dropout, monkeypatch,
                         maps=COMMON["num_hidden_layers"]):
    """Both models in training mode on the same weights and inputs: hidden states and
    the `maps` attention maps within 1e-5, gradients within 1e-4 of the largest."""
    ours.load_state_dict(eager.state_dict())
    torch.manual_seed(5)
    hidden, attentions, grads = run(ours.train(), inputs, real)
    attnlab_masks_in_eager(monkeypatch)
    torch.manual_seed(5)
    ref_hidden, ref_attentions, ref_grads = run(eager.train(), inputs, real)
    if attention_dropout:
        # The dropout acted: rows of real tokens whose weights no longer sum to 1.
        assert any((a.sum(-1) - 1).abs()[real[:, None, :].expand(a.shape[:-1])].max() > 1e-3
                   for a in attentions), "no weight was dropped"
    scale = ref_hidden.abs().max()
    assert (hidden - ref_hidden)[real].abs().max() <= 1e-5 * scale
    assert len(attentions) == len(ref_attentions) == maps
    for mine, theirs in zip(attentions, ref_attentions):
        rows = real[:, None, :, None].expand_as(mine)
        assert (mine - theirs)[rows].abs().max() <= 1e-5
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        reference = ref_grads[name]
        scale = reference.abs().max()
        if name.endswith(("k_proj.bias", "key.bias")):
            # exactly 0 (one number added to all of a query's scores leaves its softmax as it
            # is), so rounding noise in both: measured against the key weight's gradient
            scale = ref_grads[name[:-len("bias")] + "weight"].abs().max()
        assert (grad - reference).abs().max() <= 1e-4 * max(scale, 1e-3), name


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_architecture_matches_eager(model_type, attention_dropout, one_thread, monkeypatch):
    eager = build(model_type, "eager", attention_dropout)
    ours = build(model_type, "attnlab", attention_dropout)
    ids, mask = padded_batch()
    assert_matches_eager(eager, ours, dict(input_ids=ids, attention_mask=mask), mask.bool(),
                         attention_dropout, monkeypatch)


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
@pytest.mark.parametrize("model_type", sorted(OTHER_ARCHITECTURES))
def test_vision_and_encoder_decoder_architectures_match_eager(model_type, attention_dropout,
                                                              one_thread, monkeypatch):
    eager = build(model_type, "eager", attention_dropout)
    ours = build(model_type, "attnlab", attention_dropout)
    if model_type == "bart":  # padded source and target: 2 layers × (encoder, decoder, cross)
        ids, mask = padded_batch()
        inputs = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=ids,
                      decoder_attention_mask=mask)
        assert_matches_eager(eager, ours, inputs, mask.bool(), attention_dropout, monkeypatch,
                             maps=3 * COMMON["num_hidden_layers"])
        return
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    # 16 patches and the class token (DeiT adds its distillation token)
    real = torch.ones(2, 18 if model_type == "deit" else 17, dtype=torch.bool)
    assert_matches_eager(eager, ours, dict(pixel_values=pixels), real, attention_dropout,
                         monkeypatch)


# initializer_range (init_std) larger than the default 0.02, at which these models' weights are
# almost uniform: a wrong scale of the scores would hide in the tolerances there.
PIX2STRUCT_VISION = dict(hidden_size=32, patch_embed_hidden_size=12, d_ff=48, d_kv=8,
                         num_hidden_layers=2, num_attention_heads=4, seq_len=16, dropout_rate=0.0,
                         initializer_range=0.1)


def flattened_patches():
    """Pix2Struct's input, a right-padded batch of patches: row and column index, then the
    12 pixel values of each patch; padding patches are all zeros, and masked."""
    gen = torch.Generator().manual_seed(1)
    patches = torch.randn(len(LENGTHS), LENGTH, 2 + 12, generator=gen)
    patches[:, :, 0] = torch.arange(LENGTH) // 3 + 1
    patches[:, :, 1] = torch.arange(LENGTH) % 3 + 1
    mask = torch.zeros(len(LENGTHS), LENGTH)
    for row, n in enumerate(LENGTHS):
        mask[row, :n] = 1
    return patches * mask[..., None], mask


@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
def test_pix2struct_vision_encoder_matches_eager(attention_dropout, one_thread, monkeypatch):
    """Pix2Struct's vision encoder goes through the interface, without scaling the scores. Its
    encoder takes output_attentions and does not pass it on: the attentions are there all the
    same, and eager's."""
    models = []
    for implementation in ("eager", "attnlab"):
        config = transformers.Pix2StructVisionConfig(
            **PIX2STRUCT_VISION, attention_dropout=attention_dropout,
            attn_implementation=implementation)
        torch.manual_seed(0)
        models.append(transformers.Pix2StructVisionModel(config))
    patches, mask = flattened_patches()
    assert_matches_eager(*models, dict(flattened_patches=patches, attention_mask=mask),
                         mask.bool(), attention_dropout, monkeypatch)


@pytest.mark.parametrize("channel_attention", [False, True], ids=["time", "time_and_channels"])
@pytest.mark.parametrize("attention_dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
def test_patchtst_matches_eager(attention_dropout, channel_attention, one_thread, monkeypatch):
    """PatchTST attends across the patches of each channel (the attentions it returns) and,
    with channel_attention, with the same layer across the channels at each patch: no mask,
    not causal, both through the interface."""
    channels, context, patch = 3, 24, 4
    models = []
    for implementation in ("eager", "attnlab"):
        config = transformers.PatchTSTConfig(
            num_input_channels=channels, context_length=context, patch_length=patch,
            patch_stride=patch, d_model=32, num_attention_heads=4, num_hidden_layers=2,
            ffn_dim=48, channel_attention=channel_attention, attention_dropout=attention_dropout,
            dropout=0.0, positional_dropout=0.0, path_dropout=0.0, ff_dropout=0.0,
            head_dropout=0.0, init_std=0.2)
        torch.manual_seed(0)
        models.append(transformers.AutoModel.from_config(
            config, attn_implementation=implementation))
    series = torch.randn(2, context, channels, generator=torch.Generator().manual_seed(1))
    real = torch.ones(2 * channels, context // patch, dtype=torch.bool)
    assert_matches_eager(*models, dict(past_values=series), real, attention_dropout,
                         monkeypatch)


LONGT5 = dict(vocab_size=COMMON["vocab_size"], d_model=32, d_kv=8, d_ff=48, num_layers=2,
              num_heads=4, local_radius=2, global_block_size=3, dropout_rate=0.0)


@pytest.mark.parametrize("backend", ["attnlab", "attnlab_sparsemax"])
@pytest.mark.parametrize("attention_type", ["local", "transient-global"])
@pytest.mark.parametrize("model_class", ["LongT5Model", "LongT5ForConditionalGeneration",
                                         "LongT5EncoderModel"])
def test_longt5_is_refused(model_class, attention_type, backend, one_thread):
    """LongT5's encoder attends in its own layers (blocks of local_radius + 1 queries against
    three blocks of keys, and transient global tokens), never through the interface; its decoder
    adds a relative position bias. The encoder-only model would never call attnlab at all: the
    model refuses attnlab's names when it runs, and runs as before with eager."""
    model = getattr(transformers, model_class)
    config = dict(LONGT5, encoder_attention_type=attention_type)
    eager = model(transformers.LongT5Config(**config, attn_implementation="eager"))
    ours = model(transformers.LongT5Config(**config, attn_implementation=backend))
    ids, mask = padded_batch()
    inputs = dict(input_ids=ids, attention_mask=mask)
    if model_class != "LongT5EncoderModel":
        inputs["decoder_input_ids"] = ids
    with torch.no_grad():
        assert torch.isfinite(eager(**inputs)[0]).all()
        with pytest.raises(ValueError, match=rf"attn_implementation='{backend}': LongT5 computes "
                           r"its encoder's local and transient-global attention in its own "
                           r"layers .* not through transformers' AttentionInterface"):
            ours(**inputs)
        # switched over from eager, the same
        eager.set_attn_implementation(backend)
        with pytest.raises(ValueError, match="LongT5 computes its encoder's"):
            eager(**inputs)


def test_pix2struct_text_decoder_is_refused(one_thread, monkeypatch):
    """Pix2Struct's text decoder passes a relative position bias (zeros in the layers without
    one) beside the mask, which the backend refuses, naming the layer; its vision encoder has
    run through attnlab by then."""
    config = dict(text_config=dict(vocab_size=COMMON["vocab_size"], hidden_size=32, d_kv=8,
                                   d_ff=48, num_layers=2, num_heads=4, dropout_rate=0.0),
                  vision_config=PIX2STRUCT_VISION)
    eager = transformers.Pix2StructForConditionalGeneration(
        transformers.Pix2StructConfig(**config, attn_implementation="eager"))
    ours = transformers.Pix2StructForConditionalGeneration(
        transformers.Pix2StructConfig(**config, attn_implementation="attnlab"))
    patches, mask = flattened_patches()
    ids, _ = padded_batch()
    inputs = dict(flattened_patches=patches, attention_mask=mask, decoder_input_ids=ids)
    calls = []
    original = functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    monkeypatch.setattr(functional, "scaled_dot_product_attention", counting)
    with torch.no_grad():
        assert torch.isfinite(eager(**inputs).logits).all()
        assert not calls
        with pytest.raises(ValueError, match=r"attn_implementation='attnlab': "
                           r"Pix2StructTextAttention passed position_bias \(an additive "
                           r"position bias"):
            ours(**inputs)
    assert len(calls) == PIX2STRUCT_VISION["num_hidden_layers"]  # the vision encoder's layers
