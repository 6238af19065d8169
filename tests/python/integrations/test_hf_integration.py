"""attn_implementation="attnlab" in Hugging Face transformers models against transformers' own
"eager" attention (plain matmul -> softmax -> matmul), on tiny randomly initialised models built
from configs (nothing is downloaded).

Padded batches: BERT (bidirectional, right padding), GPT-2 (causal, right padding) and Llama
(causal, grouped-query attention, left padding). Compared: last hidden states, every layer's
attentions, gradients of every parameter and of the input embeddings, at the positions where
attention is defined: a query whose keys are all masked (a left-padding token in a causal
model) gets zeros from attnlab and uniform weights from eager, and no real token sees it.
"""

import copy
import math
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

transformers = pytest.importorskip(
    "transformers", reason="transformers is optional (pip install attnlab[hf])")

import attnlab.functional  # noqa: E402
import attnlab.integrations.transformers as hf  # noqa: E402
from transformers import AutoModel, BertConfig, GPT2Config, LlamaConfig  # noqa: E402

VOCAB, LENGTH = 61, 9
LENGTHS = (9, 5, 7)  # a padded batch of three


def make_config(name, **overrides):
    """A tiny config with dropout off; initializer_range 0.3 makes the attention far from
    uniform, so that a mistake in the weights shows."""
    if name == "bert":
        args = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, max_position_embeddings=32,
                    attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
        return BertConfig(**{**args, "initializer_range": 0.3, **overrides})
    if name == "gpt2":
        args = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                    attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0,
                    eos_token_id=0)
        return GPT2Config(**{**args, "initializer_range": 0.3, **overrides})
    if name == "llama":  # 4 query heads sharing 2 key/value heads
        args = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0)
        return LlamaConfig(**{**args, "initializer_range": 0.3, **overrides})
    raise ValueError(name)


CAUSAL = {"bert": False, "gpt2": True, "llama": True}
LEFT_PADDING = {"bert": False, "gpt2": False, "llama": True}


def model_pair(name, dtype=torch.float32, **overrides):
    """The same randomly initialised model with eager attention and with attnlab's. Each gets its
    own config: from_config writes attn_implementation into the config it is given."""
    torch.manual_seed(0)
    eager = AutoModel.from_config(make_config(name, **overrides), attn_implementation="eager")
    ours = AutoModel.from_config(make_config(name, **overrides), attn_implementation="attnlab")
    ours.load_state_dict(eager.state_dict())
    assert eager.config._attn_implementation == "eager"
    assert ours.config._attn_implementation == "attnlab"
    return eager.to(dtype).eval(), ours.to(dtype).eval()


def padded_batch(name, lengths=LENGTHS, length=LENGTH):
    """Token ids and the 2-D padding mask (1 = real token), padded on the right or the left."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, VOCAB, (len(lengths), length), generator=gen)
    mask = torch.zeros(len(lengths), length, dtype=torch.long)
    for row, n in enumerate(lengths):
        if LEFT_PADDING[name]:
            mask[row, length - n:] = 1
        else:
            mask[row, :n] = 1
    return ids, mask


def allowed_keys(name, mask):
    """[B, L_q, L_k]: which keys each query may see (written here, not taken from transformers)."""
    allowed = mask.bool()[:, None, :].expand(-1, mask.shape[1], -1)
    if CAUSAL[name]:
        allowed = allowed & torch.ones(mask.shape[1], mask.shape[1], dtype=torch.bool).tril()
    return allowed


def assert_rel(actual, expected, tol, what, scale=None):
    """max |actual - expected| <= tol * scale, scale = max |expected| unless given."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    scale = expected.abs().max().item() if scale is None else scale
    error = (actual - expected).abs().max().item()
    assert scale > 0, f"{what}: the reference is all zeros"
    assert error <= tol * scale, f"{what}: max error {error:.3g} > {tol} x {scale:.3g}"


def assert_gradients(grads, ref_grads, tol):
    """Every gradient within tol of eager's, relative to its largest entry. A key projection's
    bias has an exact gradient of zero (adding the same number to a query's scores leaves its
    softmax unchanged), so both are rounding noise there: measured against the scale of the
    key weight's gradient instead."""
    assert grads.keys() == ref_grads.keys()
    for key in ref_grads:
        scale = None
        if key.endswith(("key.bias", "k_proj.bias")):
            scale = ref_grads[key[:-len("bias")] + "weight"].abs().max().item()
        assert_rel(grads[key], ref_grads[key], tol, f"gradient of {key}", scale)


def run(model, ids, mask, output_attentions, loss_weights=None, defined=None,
        attention_targets=None):
    """Forward from input embeddings (so that they get a gradient), optionally backward of
    sum(last_hidden_state * loss_weights) over the positions where attention is defined, plus
    sum(attentions[l] * attention_targets[l]) over the layers when targets are given."""
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    model.zero_grad(set_to_none=True)
    out = model(inputs_embeds=embeds, attention_mask=mask, output_attentions=output_attentions)
    grads = None
    if loss_weights is not None:
        loss = (out.last_hidden_state * loss_weights)[defined].sum()
        for weights, target in zip(out.attentions or (), attention_targets or ()):
            loss = loss + (weights * target).sum()
        loss.backward()
        grads = {"inputs_embeds": embeds.grad}
        grads.update({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    return out, grads


@pytest.fixture
def spy(monkeypatch):
    """Records every call the backend makes to attnlab.functional.scaled_dot_product_attention."""
    calls = []
    original = attnlab.functional.scaled_dot_product_attention

    def recording(query, key, value, **kwargs):
        calls.append(dict(query=query.shape, key=key.shape, key_stride=key.stride(), **kwargs))
        return original(query, key, value, **kwargs)

    monkeypatch.setattr(attnlab.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("name,dtype,tol,left_padding", [
    ("bert", torch.float32, 1e-5, False), ("bert", torch.float64, 1e-12, False),
    ("gpt2", torch.float32, 1e-5, False), ("gpt2", torch.float64, 1e-12, False),
    ("llama", torch.float32, 1e-5, True),
    # Llama's eager attention takes its softmax in float32 even for float64 models (so it is
    # only a float32-accurate reference), and there the -inf of a fully padded row becomes NaN,
    # which then reaches every token of that sequence: right padding, float32 rounding.
    ("llama", torch.float64, 1e-6, False),
], ids=["bert-float32", "bert-float64", "gpt2-float32", "gpt2-float64", "llama-float32",
        "llama-float64"])
def test_matches_eager_with_attentions(name, dtype, tol, left_padding, one_thread, spy,
                                       monkeypatch):
    monkeypatch.setitem(LEFT_PADDING, name, left_padding)
    eager, ours = model_pair(name, dtype)
    ids, mask = padded_batch(name)
    allowed = allowed_keys(name, mask)
    defined = allowed.any(-1)  # [B, L] queries with at least one key
    assert not defined.all() if LEFT_PADDING[name] else defined.all()
    loss_weights = torch.randn(eager.config.hidden_size, dtype=dtype,
                               generator=torch.Generator().manual_seed(2))

    # Every position counts, padding included: transformers' shifted loss reads the logits at
    # the last padded position of a left-padded sequence.
    everywhere = torch.ones_like(defined)
    ref, ref_grads = run(eager, ids, mask, True, loss_weights, everywhere)
    out, grads = run(ours, ids, mask, True, loss_weights, everywhere)

    assert len(spy) == eager.config.num_hidden_layers
    assert all(call["need_weights"] for call in spy), "output_attentions must use need_weights"
    assert_rel(out.last_hidden_state, ref.last_hidden_state, tol, "last hidden state")
    assert len(out.attentions) == len(ref.attentions) == eager.config.num_hidden_layers
    heads = eager.config.num_attention_heads
    for layer, (mine, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        assert mine.shape == (len(LENGTHS), heads, LENGTH, LENGTH)
        assert_rel(mine, theirs, tol, f"attentions of layer {layer}")
        # Masked keys get exactly 0 in rows that see a key; a row with no key at all gets
        # eager's uniform weights 1/L over every key, masked ones included.
        rows = defined[:, None, :].expand(-1, heads, -1)
        assert (mine.masked_select(~allowed[:, None] & rows[..., None]) == 0).all()
        if not defined.all():
            assert (mine[~rows] - 1.0 / LENGTH).abs().max() < 1e-6
        assert mine.requires_grad == theirs.requires_grad
    assert_gradients(grads, ref_grads, tol)


@pytest.mark.parametrize("name,dtype,tol", [
    ("bert", torch.float64, 1e-12), ("gpt2", torch.float64, 1e-12),
    ("llama", torch.float32, 1e-5)])
def test_a_loss_on_the_attentions_gives_eager_gradients(name, dtype, tol, one_thread):
    # Attention supervision and entropy terms: the returned attentions carry gradients, as
    # eager's do.
    eager, ours = model_pair(name, dtype)
    ids, mask = padded_batch(name)
    defined = allowed_keys(name, mask).any(-1)
    gen = torch.Generator().manual_seed(3)
    loss_weights = torch.randn(eager.config.hidden_size, dtype=dtype, generator=gen)
    shape = (len(LENGTHS), eager.config.num_attention_heads, LENGTH, LENGTH)
    targets = [torch.randn(shape, dtype=dtype, generator=gen)
               for _ in range(eager.config.num_hidden_layers)]
    _, ref_grads = run(eager, ids, mask, True, loss_weights, defined, targets)
    _, grads = run(ours, ids, mask, True, loss_weights, defined, targets)
    _, output_only = run(ours, ids, mask, True, loss_weights, defined)
    assert_gradients(grads, ref_grads, tol)
    # The attention term changes the gradients: it is not lost on the way.
    first = next(key for key in grads if "query" in key or "q_proj" in key or "c_attn" in key)
    assert (grads[first] - output_only[first]).abs().max() > 100 * tol * grads[first].abs().max()


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_matches_eager_without_attentions(name, one_thread, spy):
    eager, ours = model_pair(name)
    ids, mask = padded_batch(name)
    defined = allowed_keys(name, mask).any(-1)
    loss_weights = torch.randn(eager.config.hidden_size, generator=torch.Generator().manual_seed(2))
    ref, ref_grads = run(eager, ids, mask, False, loss_weights, defined)
    out, grads = run(ours, ids, mask, False, loss_weights, defined)
    assert out.attentions is None and ref.attentions is None
    with torch.no_grad():  # other outputs collected: still no weights
        hidden = ours(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    assert len(hidden.hidden_states) == eager.config.num_hidden_layers + 1
    assert spy and not any(call["need_weights"] for call in spy)
    assert_rel(out.last_hidden_state[defined], ref.last_hidden_state[defined], 1e-5, "hidden")
    assert_gradients(grads, ref_grads, 1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_no_padding_uses_the_causal_flag(name, one_thread, spy):
    """Without padding transformers gives no mask: causality then comes from is_causal."""
    eager, ours = model_pair(name)
    ids = padded_batch(name)[0]
    with torch.no_grad():
        ref = eager(input_ids=ids, output_attentions=True)
        out = ours(input_ids=ids, output_attentions=True)
    assert all(call["attn_mask"] is None and call["is_causal"] == CAUSAL[name] for call in spy)
    assert_rel(out.last_hidden_state, ref.last_hidden_state, 1e-5, "hidden")
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert_rel(mine, theirs, 1e-5, "attentions")


@pytest.mark.parametrize("overrides", [dict(scale_attn_by_inverse_layer_idx=True),
                                       dict(scale_attn_weights=False)],
                         ids=["scale-by-layer", "unscaled"])
def test_scaling_follows_the_model(overrides, one_thread, spy):
    """GPT-2's optional scalings (1/sqrt(d)/(layer + 1), or none at all) reach the operator."""
    eager, ours = model_pair("gpt2", **overrides)
    ids, mask = padded_batch("gpt2")
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    expected = [8 ** -0.5 / (layer + 1) for layer in range(2)] \
        if overrides.get("scale_attn_by_inverse_layer_idx") else [1.0, 1.0]
    assert [call["scale"] for call in spy] == pytest.approx(expected)
    assert_rel(out.last_hidden_state, ref.last_hidden_state, 1e-5, "hidden")
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert_rel(mine, theirs, 1e-5, "attentions")


class OperatorInputs(TorchDispatchMode):
    """Records the shapes of the query and key of every call of attnlab's attention kernels."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "attnlab":  # (the model calls no other attnlab operator)
            self.shapes.append((tuple(args[0].shape), tuple(args[1].shape)))
        return func(*args, **(kwargs or {}))


def test_grouped_query_attention_does_not_repeat_keys(one_thread, spy):
    """Llama with 6 query heads on 2 key/value heads: the backend asks for enable_gqa, and keys
    reach the operator as [B, kv_heads, 1, L, D] (broadcast over the 3 query heads of a group),
    never repeated."""
    eager, ours = model_pair("llama", num_attention_heads=6, num_key_value_heads=2,
                             hidden_size=48, head_dim=8)
    ids, mask = padded_batch("llama")
    defined = allowed_keys("llama", mask).any(-1)
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        with OperatorInputs() as operator:
            out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    for call in spy:
        assert call["enable_gqa"] and call["key"] == (len(LENGTHS), 2, LENGTH, 8)
    assert len(operator.shapes) >= len(spy)
    assert set(operator.shapes) == {((len(LENGTHS), 2, 3, LENGTH, 8),
                                     (len(LENGTHS), 2, 1, LENGTH, 8))}
    assert_rel(out.last_hidden_state[defined], ref.last_hidden_state[defined], 1e-5, "hidden")
    rows = defined[:, None, :].expand(-1, 6, -1)
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert mine.shape == (len(LENGTHS), 6, LENGTH, LENGTH)
        assert_rel(mine[rows], theirs[rows], 1e-5, "attentions")


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operator returns, by dtype."""

    def __init__(self):
        super().__init__()
        self.largest = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in torch.utils._pytree.tree_leaves(result):
            if isinstance(tensor, torch.Tensor):
                self.largest[tensor.dtype] = max(self.largest.get(tensor.dtype, 0),
                                                 tensor.numel())
        return result


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_no_length_squared_tensor_without_attentions(name, one_thread):
    """At L = 256 (L x L = 65,536 elements, 256 times a hidden state row) no operator returns
    a tensor of L x L elements or more, forward or backward, unless the attentions are asked
    for. With padding, transformers' boolean mask is the only one (one byte per entry, shared by
    the heads and layers)."""
    length = 256
    _, ours = model_pair(name, **{"n_positions" if name == "gpt2" else
                                  "max_position_embeddings": length})
    ids = torch.randint(1, VOCAB, (1, length))
    for mask, output_attentions in ((None, False), (torch.ones_like(ids), True)):
        if mask is not None:
            mask[0, :3] = 0 if LEFT_PADDING[name] else 1
            mask[0, -3:] = 1 if LEFT_PADDING[name] else 0
        recorder = LargestTensor()
        with recorder:
            out = ours(input_ids=ids, attention_mask=mask, output_attentions=output_attentions)
            out.last_hidden_state.sum().backward()
        floats = max(n for dtype, n in recorder.largest.items() if dtype.is_floating_point)
        if output_attentions:  # the check can fail: the weights are L x L per head
            assert floats >= length * length
        else:
            assert floats < length * length, f"a float tensor of {floats} elements"
            assert recorder.largest.get(torch.bool, 0) < length * length  # no mask either
    # padding without attentions: only the boolean mask reaches L x L
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0
    recorder = LargestTensor()
    with recorder, torch.no_grad():
        ours(input_ids=ids, attention_mask=mask)
    assert max(n for dtype, n in recorder.largest.items() if dtype.is_floating_point) \
        < length * length
    assert recorder.largest[torch.bool] == length * length


def test_from_pretrained_and_set_attn_implementation(tmp_path, one_thread, spy):
    """A saved model loads with attn_implementation="attnlab"; output_attentions is asked per
    call. transformers itself refuses output_attentions in the config of any implementation
    but eager (loudly, rather than switching to eager behind the user's back)."""
    eager, _ = model_pair("gpt2")
    eager.save_pretrained(tmp_path)
    ours = AutoModel.from_pretrained(tmp_path, attn_implementation="attnlab").eval()
    assert ours.config._attn_implementation == "attnlab"
    ids, mask = padded_batch("gpt2")
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert spy and all(call["need_weights"] for call in spy)
    assert_rel(out.last_hidden_state, ref.last_hidden_state, 1e-5, "hidden")
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert_rel(mine, theirs, 1e-5, "attentions")
    with pytest.raises(Exception, match="output_attentions"):
        AutoModel.from_pretrained(tmp_path, attn_implementation="attnlab", output_attentions=True)

    # switching an eager model over
    spy.clear()
    eager.set_attn_implementation("attnlab")
    with torch.no_grad():
        switched = eager(input_ids=ids, attention_mask=mask)
    assert len(spy) == eager.config.num_hidden_layers
    assert_rel(switched.last_hidden_state, ref.last_hidden_state, 1e-5, "hidden")


def test_generate_with_left_padding_and_cache(one_thread):
    """Greedy decoding with a key/value cache (one query per step, cached keys, left padding)
    picks the same tokens as eager and returns the same attentions at every step."""
    torch.manual_seed(0)
    eager = transformers.LlamaForCausalLM(make_config("llama"))
    eager.config._attn_implementation = "eager"
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation("attnlab")
    eager.eval(), ours.eval()
    ids, mask = padded_batch("llama", lengths=(6, 4), length=6)
    args = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0,
                output_attentions=True, return_dict_in_generate=True)
    ref = eager.generate(ids, **args)
    out = ours.generate(ids, **args)
    assert torch.equal(out.sequences, ref.sequences)
    assert len(out.attentions) == len(ref.attentions) == 4
    for step, (mine, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        keys = mine[0].shape[-1]
        full = torch.cat([mask, torch.ones(2, keys - mask.shape[1], dtype=mask.dtype)], 1)
        queries = mine[0].shape[-2]
        defined = allowed_keys("llama", full)[:, -queries:].any(-1)
        rows = defined[:, None, :].expand(-1, 4, -1)
        for a, b in zip(mine, theirs):
            assert_rel(a[rows], b[rows], 1e-5, f"attentions at step {step}")


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_training_with_the_default_dropout_of_0_1_learns_and_reproduces(name, one_thread):
    """BERT and GPT-2 with their default dropout (0.1 on the attention weights and elsewhere)
    train through attnlab: a fixed batch's loss falls, and the same seed gives the same run.
    (test_hf_architectures compares train mode with attention dropout against eager.)"""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM
    dropout = (dict(attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.1) if name == "bert"
               else dict(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1))
    head = AutoModelForMaskedLM if name == "bert" else AutoModelForCausalLM
    ids, mask = padded_batch(name)
    labels = ids.masked_fill(mask == 0, -100)

    def train(steps=15):
        torch.manual_seed(0)
        model = head.from_config(make_config(name, initializer_range=0.02, **dropout),
                                 attn_implementation="attnlab").train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    losses = train()
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    assert train() == losses


def test_training_without_attention_dropout_matches_eager(one_thread):
    eager, ours = model_pair("gpt2")
    eager.train(), ours.train()
    ids, mask = padded_batch("gpt2")
    loss_weights = torch.randn(32, generator=torch.Generator().manual_seed(2))
    defined = mask.bool()
    ref, ref_grads = run(eager, ids, mask, False, loss_weights, defined)
    out, grads = run(ours, ids, mask, False, loss_weights, defined)
    assert_rel(out.last_hidden_state[defined], ref.last_hidden_state[defined], 1e-5, "hidden")
    assert_gradients(grads, ref_grads, 1e-5)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_left_padded_causal_lm_training_gives_eagers_loss_and_gradients(name, one_thread):
    """The shifted loss of a causal LM reads the logits at the last pad position of a
    left-padded sequence, a query that sees no key: the backend gives it eager's uniform
    weights, so the loss and every gradient are eager's."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(make_config(name), attn_implementation="eager")
    ours = AutoModelForCausalLM.from_config(make_config(name), attn_implementation="attnlab")
    ours.load_state_dict(eager.state_dict())
    ids, mask = padded_batch("llama")  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    losses, grads = [], []
    for model in (eager, ours):
        model.train()
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert abs(losses[1] - losses[0]) <= 1e-6 * abs(losses[0]), losses
    assert_gradients(grads[1], grads[0], 1e-5)


def test_modernbert_runs_and_matches_eager(one_thread):
    """ModernBERT passes flash-attention's ``deterministic`` keyword, which cannot change the
    result: ignored, and the model matches eager (its global and sliding-window layers)."""
    from transformers import ModernBertConfig
    config = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                  num_attention_heads=4, max_position_embeddings=32, local_attention=4,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                  sep_token_id=2, initializer_range=0.3)
    torch.manual_seed(0)
    eager = AutoModel.from_config(ModernBertConfig(**config), attn_implementation="eager").eval()
    ours = AutoModel.from_config(ModernBertConfig(**config), attn_implementation="attnlab").eval()
    ours.load_state_dict(eager.state_dict())
    ids, mask = padded_batch("bert")
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    assert_rel(out.last_hidden_state, ref.last_hidden_state, 1e-5, "last hidden state")
    for layer, (mine, theirs) in enumerate(zip(out.attentions, ref.attentions)):
        assert_rel(mine, theirs, 1e-5, f"attentions of layer {layer}")


@pytest.mark.parametrize("backend", ["attnlab", "attnlab_sparsemax"])
def test_falcon_returns_its_attentions(backend, one_thread):
    """Falcon's attention layer takes output_attentions without passing it to the attention
    function: the backend reads it from the layer's call, so the attentions are there (eager's,
    for softmax) and never silently None."""
    from transformers import FalconConfig
    config = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  new_decoder_architecture=True, num_kv_heads=2, bos_token_id=0,
                  eos_token_id=0, initializer_range=0.3)
    torch.manual_seed(0)
    eager = AutoModel.from_config(FalconConfig(**config), attn_implementation="eager").eval()
    ours = AutoModel.from_config(FalconConfig(**config), attn_implementation=backend).eval()
    ours.load_state_dict(eager.state_dict())
    ids, mask = padded_batch("llama")
    with torch.no_grad():
        ref = eager(input_ids=ids, attention_mask=mask, output_attentions=True)
        out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
        plain = ours(input_ids=ids, attention_mask=mask)
    assert len(out.attentions) == 2 and all(a is not None for a in out.attentions)
    assert plain.attentions is None
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert mine.shape == theirs.shape == (len(LENGTHS), 4, LENGTH, LENGTH)
        torch.testing.assert_close(mine.sum(-1), torch.ones(mine.shape[:-1]))
        if backend == "attnlab":
            assert_rel(mine, theirs, 1e-5, "attentions")
    if backend == "attnlab":
        assert_rel(out.last_hidden_state, ref.last_hidden_state, 1e-5, "last hidden state")


def test_unknown_keyword_argument_is_refused(one_thread):
    """A keyword argument the backend does not know reaches the attention function (transformers
    passes the model's extra kwargs down) and raises instead of being ignored."""
    _, ours = model_pair("llama")
    ids, mask = padded_batch("llama")
    with pytest.raises(TypeError, match=r"attnlab.*LlamaAttention.*'temperature'"):
        ours(input_ids=ids, attention_mask=mask, temperature=0.5)


def small_qkv(heads=4, kv_heads=4):
    gen = torch.Generator().manual_seed(3)
    return (torch.randn(2, heads, 5, 8, generator=gen),
            torch.randn(2, kv_heads, 5, 8, generator=gen),
            torch.randn(2, kv_heads, 5, 8, generator=gen))


@pytest.mark.parametrize("kwargs,match", [
    (dict(softcap=30.0), r"softcap \(soft-capping"),
    (dict(s_aux=torch.zeros(4)), r"attention sinks"),
    (dict(position_bias=torch.zeros(1, 4, 5, 5)), r"position bias"),
    (dict(cu_seq_lens_q=torch.tensor([0, 5])), r"give position_ids instead"),
])
def test_unsupported_features_are_refused(kwargs, match):
    module = torch.nn.Module()
    with pytest.raises(ValueError, match=match):
        hf.attention_forward(module, *small_qkv(), None, **kwargs)


def test_unset_optional_arguments_are_accepted():
    """Arguments models pass as None (nothing asked) and the ones that the mask already holds
    leave the result unchanged."""
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = small_qkv()
    plain, _ = hf.attention_forward(module, q, k, v, None)
    same, _ = hf.attention_forward(module, q, k, v, None, softcap=None, sliding_window=4096,
                                   position_ids=torch.arange(5)[None], use_cache=True,
                                   unknown_but_unset=None)
    assert torch.equal(plain, same)


@pytest.mark.parametrize("shapes,match", [
    (((2, 4, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8)), r"query has 4 heads, key 3"),
    (((2, 4, 5, 8), (2, 2, 5, 8), (2, 1, 5, 8)), r"key 2 and value 1"),
    (((4, 5, 8), (4, 5, 8), (4, 5, 8)), r"\[batch, heads, length, head_dim\]"),
])
def test_bad_head_layouts_are_refused(shapes, match):
    tensors = [torch.zeros(shape) for shape in shapes]
    with pytest.raises(ValueError, match=match):
        hf.attention_forward(torch.nn.Module(), *tensors, None)


def test_direct_call_against_reference():
    """The backend's contract on its own, against plain float64 torch ops written here: GQA
    (head h on key/value head h // 2), a float mask with -inf, scaling, transposed output."""
    q, k, v = (t.double() for t in small_qkv(heads=4, kv_heads=2))
    mask = torch.zeros(2, 1, 5, 5, dtype=torch.float64)
    mask[0, 0, :, 3:] = float("-inf")
    mask[1, 0, 2, :] = float("-inf")  # a row with no key at all
    module = torch.nn.Module()
    out, weights = hf.attention_forward(module, q, k, v, mask, scaling=0.7,
                                        output_attentions=True)
    k_rep, v_rep = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ k_rep.transpose(-2, -1) * 0.7 + mask
    expected_w = torch.softmax(scores, -1).nan_to_num(0.0)
    expected = (expected_w @ v_rep).transpose(1, 2)
    assert out.shape == (2, 5, 4, 8) and weights.shape == (2, 4, 5, 5)
    assert torch.allclose(weights, expected_w, rtol=0, atol=1e-12)
    assert torch.allclose(out, expected, rtol=0, atol=1e-12)
    assert (weights[1, :, 2] == 0).all() and (out[1, 2] == 0).all()
    _, none = hf.attention_forward(module, q, k, v, mask)
    assert none is None


def test_register_is_idempotent():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    hf.register()
    hf.register()
    assert AttentionInterface()["attnlab"] is hf.attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["attnlab"] is sdpa_mask
    assert hf.NAME == "attnlab"


def test_missing_transformers_names_the_extra():
    """Without transformers, importing the integration says what to install (and attnlab
    itself still imports)."""
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import attnlab\n"
            "try:\n"
            "    import attnlab.integrations.transformers\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert "pip install attnlab[hf]" in result.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_cuda_matches_eager(name, monkeypatch):
    if not attnlab.build_info()["cuda"]:
        pytest.skip("this attnlab build has no CUDA kernels")
    eager, ours = model_pair(name)
    eager, ours = eager.cuda(), ours.cuda()
    ids, mask = (t.cuda() for t in padded_batch(name))
    defined = allowed_keys(name, mask.cpu()).any(-1).cuda()
    loss_weights = torch.randn(eager.config.hidden_size, device="cuda")
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # eager in true fp32
    ref, ref_grads = run(eager, ids, mask, True, loss_weights, defined)
    out, grads = run(ours, ids, mask, True, loss_weights, defined)
    assert_rel(out.last_hidden_state[defined], ref.last_hidden_state[defined], 1e-5, "hidden")
    rows = defined[:, None, :].expand(-1, eager.config.num_attention_heads, -1)
    for mine, theirs in zip(out.attentions, ref.attentions):
        assert_rel(mine[rows], theirs[rows], 1e-5, "attentions")
    assert_gradients(grads, ref_grads, 1e-5)


def test_attentions_plot_with_attention_grid(one_thread):
    """out.attentions is what attnlab.plot.attention_grid draws: one row per layer."""
    from attnlab.plot import attention_grid
    _, ours = model_pair("llama")
    ids, mask = padded_batch("llama")
    with torch.no_grad():
        out = ours(input_ids=ids, attention_mask=mask, output_attentions=True)
    fig = attention_grid(out.attentions, index=1)
    images = [ax for ax in fig.axes if ax.images]
    assert len(images) == 2 * 4  # layers x heads
    # the padded second sequence: the first 4 queries (left padding) see no key, and get eager's
    # uniform weights
    padded = images[0].images[0].get_array()[:LENGTH - LENGTHS[1]]
    assert abs(padded - 1.0 / LENGTH).max() < 1e-6
