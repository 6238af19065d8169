"""attnlab.tutorials.permutation_lab: the permutation lab's code, written as the lab writes it
(its masks, True = blocked; its attention interface; its model), against float64 references."""

import math

import pytest
import torch

import attnlab
from attnlab.tutorials.permutation_lab import (AdditiveAttention, MultiplicativeAttention,
                                               PermMultiplier, PositionalEncoder,
                                               ScaledDotAttention, ScaledDotProductAttention,
                                               check_model, get_autoregressive_mask,
                                               perm_accuracy, perm_generator,
                                               plot_attention_map, plot_positional_encoder,
                                               train_perm_multiplier)

TIGHT = dict(rtol=1e-5, atol=1e-6)


def ref_attend(scores, features, blocked=None):
    """softmax over the objects of ``scores`` [B, Q, K] (blocked → -inf) times the features, in
    float64."""
    scores = scores.double()
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ features.double(), weights


def ref_scores(layer, features, queries):
    f, q = features.double(), queries.double()
    if isinstance(layer, AdditiveAttention):
        hidden = torch.tanh((q @ layer.W1.weight.double().T).unsqueeze(2)
                            + (f @ layer.W2.weight.double().T).unsqueeze(1))
        return hidden @ layer.w3.weight.double()[0]
    scale = 1.0 if isinstance(layer, MultiplicativeAttention) else 1 / math.sqrt(q.shape[-1])
    return q @ f.transpose(-2, -1) * scale


def make_layers(width):
    return [AdditiveAttention(width, width + 3, 12), MultiplicativeAttention(),
            ScaledDotProductAttention()]


def test_autoregressive_mask_blocks_the_future():
    mask = get_autoregressive_mask(4)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, torch.ones(4, 4).triu(1).bool())  # True = may not attend
    assert ScaledDotProductAttention.get_autoregressive_mask(3).equal(get_autoregressive_mask(3))
    assert ScaledDotAttention is ScaledDotProductAttention


@pytest.mark.parametrize("kind", ["additive", "multiplicative", "scaled"])
def test_attention_layers_with_the_labs_masks(kind):
    torch.manual_seed(0)
    B, L, F = 3, 6, 8
    layer = dict(zip(["additive", "multiplicative", "scaled"], make_layers(F)))[kind]
    features = torch.randn(B, L, F)
    queries = torch.randn(B, L, F + 3 if kind == "additive" else F)
    torch.testing.assert_close(layer.get_scores(features, queries).double(),
                               ref_scores(layer, features, queries), **TIGHT)

    mask = get_autoregressive_mask(L)
    out = layer.attend(features, queries, mask)
    expected, weights = ref_attend(ref_scores(layer, features, queries), features, mask)
    torch.testing.assert_close(out.double(), expected, **TIGHT)
    torch.testing.assert_close(layer.last_weights.double(), weights, **TIGHT)
    assert bool((layer.last_weights.triu(1) == 0).all())

    padding = torch.zeros(B, 1, L, dtype=torch.bool)  # a per-sample mask: last object padded
    padding[:, :, -1] = True
    out = layer(features, queries, mask=padding)
    expected, _ = ref_attend(ref_scores(layer, features, queries), features, padding)
    torch.testing.assert_close(out.double(), expected, **TIGHT)
    assert bool((layer.last_weights[..., -1] == 0).all())


def test_lab_mask_needs_the_adapter():
    """What the adapter is for: attnlab.nn's layers read True as "may attend", so the lab's
    autoregressive mask given to them unchanged lets each query see only the future."""
    torch.manual_seed(1)
    features, queries = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    mask = get_autoregressive_mask(5)
    core = attnlab.nn.ScaledDotProductAttention()
    core.attend(features, queries, mask)
    lab = ScaledDotProductAttention()
    lab.attend(features, queries, mask)
    assert bool((core.last_weights.tril() == 0).all())  # inverted: past and present blocked
    assert bool((lab.last_weights.triu(1) == 0).all())  # causal


def test_fully_masked_query_gets_zeros_not_nan():
    torch.manual_seed(2)
    features, queries = torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    mask = torch.tensor([[False, True, False], [True, True, True], [False, False, False]])
    layer = ScaledDotProductAttention()
    out = layer.attend(features, queries, mask)
    assert torch.equal(out[0, 1], torch.zeros(4))  # the lab's softmax would give NaN here
    assert torch.equal(layer.last_weights[0, 1], torch.zeros(3))
    expected, _ = ref_attend(ref_scores(layer, features, queries), features, mask)
    assert torch.isnan(expected[0, 1]).all()
    torch.testing.assert_close(out[0, [0, 2]].double(), expected[0, [0, 2]], **TIGHT)


def test_perm_generator_targets():
    torch.manual_seed(3)
    inputs, targets = perm_generator(64, 10)
    assert inputs.shape == targets.shape == (64, 20) and inputs.dtype == torch.long
    p1, p2 = inputs[:, :10], inputs[:, 10:]
    assert torch.equal(p1.sort(-1).values, torch.arange(10).expand(64, 10))
    assert torch.equal(p2.sort(-1).values, torch.arange(10).expand(64, 10))
    assert bool((targets[:, :10] == 0).all())
    for row in range(64):
        assert targets[row, 10:].tolist() == [int(p1[row, int(j)]) for j in p2[row]]


def ref_perm_multiplier(model, x):
    """The lab's model in float64 from the model's weights (the LSTM as a float64 copy)."""
    objects = model.embedding.weight.double()[x]
    if model.pos_enc is not None:
        table = model.pos_enc.pe[: x.shape[1]].double()
        objects = (objects + table if model.pos_enc.add else
                   torch.cat([objects, table.expand(len(x), -1, -1)], dim=-1))
    lstm = torch.nn.LSTM(model.lstm.input_size, model.lstm.hidden_size, batch_first=True).double()
    lstm.load_state_dict(model.lstm.state_dict())
    queries, _ = lstm(objects)
    mask = get_autoregressive_mask(x.shape[1]) if model.autoregressive else None
    attended, _ = ref_attend(ref_scores(model.attention, objects, queries), objects, mask)
    return attended @ model.output.weight.double().T + model.output.bias.double()


@pytest.mark.parametrize("add", [True, False])
def test_perm_multiplier_matches_the_labs_equations(add):
    torch.manual_seed(4)
    perm_len, embedding_dim = 6, 8
    pos_enc = PositionalEncoder(embedding_dim, max_len=2 * perm_len, scale=10.0, add=add)
    width = embedding_dim + pos_enc.extra_output_shape
    for attention, hidden_dim in ((ScaledDotProductAttention(), width),
                                  (AdditiveAttention(width, 5, 7), 5)):
        model = PermMultiplier(perm_len, embedding_dim, hidden_dim, attention, pos_enc,
                               autoregressive=True)
        inputs, _ = perm_generator(4, perm_len)
        with torch.no_grad():
            logits = model(inputs)
            torch.testing.assert_close(logits.double(), ref_perm_multiplier(model, inputs),
                                       **TIGHT)
            # Autoregressive: the outputs before position 7 ignore what comes after it.
            changed = inputs.clone()
            changed[:, 7:] = (changed[:, 7:] + 1) % perm_len
            torch.testing.assert_close(model(changed)[:, :7], logits[:, :7], rtol=0, atol=1e-6)
            assert not torch.allclose(model(changed)[:, 7:], logits[:, 7:])


def test_perm_multiplier_learns_with_positions_only():
    perm_len, embedding_dim = 10, 32

    def train(pos_enc, num_steps):
        torch.manual_seed(5)
        model = PermMultiplier(perm_len, embedding_dim, embedding_dim,
                               ScaledDotProductAttention(), pos_enc, autoregressive=False)
        losses = train_perm_multiplier(model, num_steps=num_steps, batch_size=64, lr=3e-3)
        return model, losses

    model, losses = train(PositionalEncoder(embedding_dim, max_len=2 * perm_len, scale=0.1), 400)
    assert losses[-1] < 0.1 * losses[0]
    assert perm_accuracy(model) > 0.9
    # The query at output position n + i looks at input position p2[i].
    inputs, _ = perm_generator(200, perm_len)
    model(inputs)
    assert (model.attention.last_weights[:, perm_len:].argmax(-1)
            == inputs[:, perm_len:]).float().mean() > 0.9

    without_positions, _ = train(None, 150)  # no way to tell the positions apart
    assert perm_accuracy(without_positions) < 0.5


def test_check_model_and_plots(capsys):
    torch.manual_seed(6)
    pos_enc = PositionalEncoder(8, max_len=10, scale=0.1)
    model = PermMultiplier(5, 8, 8, MultiplicativeAttention(), pos_enc, autoregressive=False)
    check_model(model)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 5 and all("correct" in line for line in lines)
    assert plot_positional_encoder(pos_enc, show=False).axes
    inputs, _ = perm_generator(1, 5)
    fig = plot_attention_map(model, inputs[0], show=False)
    assert fig.axes[0].images[0].get_array().shape == (10, 10)


def test_bad_inputs_are_named():
    with pytest.raises(TypeError, match="True = may attend"):
        PermMultiplier(5, 8, 8, attnlab.nn.ScaledDotProductAttention(), None, True)
    with pytest.raises(ValueError, match="hidden_dim"):
        PermMultiplier(5, 8, 16, ScaledDotProductAttention(), None, False)
    with pytest.raises(TypeError, match="attend"):
        PermMultiplier(5, 8, 8, torch.nn.Linear(2, 2), None, False)
    model = PermMultiplier(5, 8, 8, ScaledDotProductAttention(), None, False)
    with pytest.raises(ValueError, match=r"digits in \[0, 5\)"):
        model(torch.full((2, 10), 5))
    with pytest.raises(TypeError, match="mask must be boolean"):
        ScaledDotProductAttention().attend(torch.randn(1, 3, 4), torch.randn(1, 3, 4),
                                           torch.zeros(3, 3))
    with pytest.raises(ValueError, match="perm_size"):
        perm_generator(4, 0)
