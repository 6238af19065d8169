"""attnlab.tutorials.neuromatch: the Neuromatch attention tutorial's code, written as the tutorial
writes it (its classes, its 4-tuple, its data generators and trainer), against float64
references of its equations."""

import math
import random
import warnings

import pytest
import torch

from attnlab.tutorials.neuromatch import (BinaryMLP, PositionalEncoding,
                                          ScaledDotProductAttention, SelfAttention, bin_acc,
                                          gained_dot_product_attention, get_n_parameters,
                                          make_train, plot_attention_graph,
                                          plot_attention_weights, plot_attention_weights_stats,
                                          plot_compare, plot_loss_accuracy, plot_samples,
                                          plot_weights_and_output, results_dict, s_Sparse_AND,
                                          s_Sparse_AND_Query, set_seed, test_sdpa)

TIGHT = dict(rtol=1e-5, atol=1e-6)


def ref_self_attention(model, x):
    """The tutorial's SelfAttention equations in float64, from the model's weights."""
    h = model.tokenizer.weight.double()[x] + model.positioner.double()
    Q, K, V = (h @ W.weight.double().T for W in (model.Wq, model.Wk, model.Wv))
    logits = Q @ K.transpose(-2, -1) / math.sqrt(model.d)
    scores = torch.softmax(logits, dim=-1)
    attention = (scores @ V).squeeze(-1)
    output = torch.sigmoid(attention @ model.linear.weight.double().T)
    return logits, scores, attention, output


def ref_table(T, d):
    """The bonus exercise's encoding: computed at the next even sizes, then cropped."""
    Te, de = T + T % 2, d + d % 2
    position = torch.arange(Te, dtype=torch.float64)[:, None]
    frequency = torch.exp(torch.arange(0, de, 2, dtype=torch.float64) * (-math.log(10000.0) / de))
    table = torch.zeros(Te, de, dtype=torch.float64)
    angle = position * frequency
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table[:T, :d]



def test_self_attention_draws_its_weights_in_the_tutorials_order():
    """Under a seed, SelfAttention's weights are the tutorial's draws: its layers' default
    initialisations, the position table drawn uniformly, then every weight re-drawn from
    N(0, 0.001) (the uniform draw moves the generator for all that follows)."""
    T, d = 17, 2
    torch.manual_seed(7)
    model = SelfAttention(T, d)
    torch.manual_seed(7)
    tokenizer = torch.nn.Embedding(2, d)
    positioner = torch.rand(1, T, d)
    wq, wk = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
    wv, linear = torch.nn.Linear(d, 1, bias=False), torch.nn.Linear(T, 1, bias=False)
    expected = [linear.weight, tokenizer.weight, positioner, wq.weight, wk.weight, wv.weight]
    with torch.no_grad():
        for weight in expected:
            weight.normal_(std=0.001)
    drawn = [model.linear.weight, model.tokenizer.weight, model.positioner, model.Wq.weight,
             model.Wk.weight, model.Wv.weight]
    for got, want in zip(drawn, expected):
        assert torch.equal(got.detach(), want.detach())

def test_self_attention_returns_the_tutorials_tuple():
    torch.manual_seed(0)
    context_length, embed_dim = 17, 2
    sat_model = SelfAttention(context_length, embed_dim)
    assert get_n_parameters(sat_model) == 65
    for parameter in sat_model.parameters():  # every weight N(0, 0.001)
        assert parameter.abs().max() < 0.01
    with torch.no_grad():  # well-scaled weights for the comparison
        for parameter in sat_model.parameters():
            parameter.normal_()
    data_gen = s_Sparse_AND_Query(context_length, 2)
    X_valid, y_valid = data_gen.generate(64, verbose=False)

    logits, scores, attention, output = sat_model(X_valid, elaborate=True)
    expected = ref_self_attention(sat_model, X_valid)
    for ours, reference, shape in zip((logits, scores, attention, output), expected,
                                      ((64, 17, 17), (64, 17, 17), (64, 17), (64, 1))):
        assert ours.shape == shape
        torch.testing.assert_close(ours.double(), reference, **TIGHT)
    torch.testing.assert_close(sat_model(X_valid), output, **TIGHT)  # elaborate=False: output only
    # The tutorial's attention-graph quantity reads the readout under its name.
    weighted = torch.einsum("bij,jk->bik", scores, sat_model.linear.weight.T)
    assert weighted.shape == (64, 17, 1)
    # Trainable: the output's gradient reaches every parameter.
    output.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in sat_model.parameters())


def test_bonus_exercise_positional_encoding_and_test_sdpa(capsys):
    for T, d in ((7, 5), (6, 4), (5, 3)):  # odd sizes at the next even size, cropped
        torch.testing.assert_close(PositionalEncoding(T, d)().double(), ref_table(T, d),
                                   rtol=0, atol=1e-7)

    torch.manual_seed(1)
    model = ScaledDotProductAttention(7, 5, 3)
    x = torch.rand(7, 5)
    h = x.double() + ref_table(7, 5)
    Q, K, V = (h @ W.weight.double().T for W in (model.Wq, model.Wk, model.Wv))
    expected = torch.softmax(Q @ K.T / math.sqrt(3), dim=-1) @ V
    torch.testing.assert_close(model(x).double(), expected, **TIGHT)

    class LearnerAttention(torch.nn.Module):  # a learner's solution, in plain torch
        def __init__(self, T, dm, dk):
            super().__init__()
            self.scale = 1.0 / math.sqrt(dk)
            self.position = PositionalEncoding(T, dm)
            self.Wq = torch.nn.Linear(dm, dk, bias=False)
            self.Wk = torch.nn.Linear(dm, dk, bias=False)
            self.Wv = torch.nn.Linear(dm, dm, bias=False)

        def forward(self, x):
            x = x + self.position()
            Q, K, V = self.Wq(x), self.Wk(x), self.Wv(x)
            return torch.softmax(Q @ K.T * self.scale, dim=-1) @ V

    class UnscaledAttention(LearnerAttention):  # a learner who forgot the scale
        def forward(self, x):
            x = x + self.position()
            return torch.softmax(self.Wq(x) @ self.Wk(x).T, dim=-1) @ self.Wv(x)

    assert test_sdpa(LearnerAttention) is True
    assert "matches" in capsys.readouterr().out
    assert test_sdpa(UnscaledAttention) is False
    assert "Not yet" in capsys.readouterr().out
    assert test_sdpa(ScaledDotProductAttention) is True


def test_sparse_and_generator():
    random.seed(2)
    torch.manual_seed(2)
    data_gen = s_Sparse_AND(13, 2)
    X_, y_ = data_gen.generate(200, verbose=False)
    correct_ids = data_gen.f_i
    assert X_.dtype == torch.int64 and X_.shape == (200, 13)
    assert y_.dtype == torch.float32 and y_.shape == (200, 1)
    assert len(correct_ids) == 2 and all(0 <= i < 13 for i in correct_ids)
    assert torch.equal(y_[:, 0], X_[:, correct_ids].all(dim=1).float())
    assert 0.4 <= y_.mean().item() <= 0.6
    for i in correct_ids:  # the targets are identifiable: no other column equals them
        for o in data_gen.others:
            assert not torch.equal(X_[:, i], X_[:, o])


def test_rule_token_generator_and_its_silent_fallback():
    random.seed(3)
    torch.manual_seed(3)
    data_gen = s_Sparse_AND_Query(17, 2)
    X, y = data_gen.generate(500)
    assert data_gen.T == 16 and X.shape == (500, 17) and y.shape == (500, 1)
    assert not set(data_gen.f_i_1) & set(data_gen.f_i_2)
    rule = X[:, -1]
    expected = torch.where(rule == 1, X[:, data_gen.f_i_2].all(1), X[:, data_gen.f_i_1].all(1))
    assert torch.equal(y[:, 0], expected.float())
    assert 0.45 <= y.mean().item() <= 0.55
    assert 0.35 < rule.float().mean().item() < 0.65  # z drawn per sample

    dense = s_Sparse_AND_Query(17, 4)  # p^4 = 0.25 never reaches the window
    with pytest.warns(UserWarning, match="returning the last draw"):
        X, y = dense.generate(500)
    assert 0.15 < y.mean().item() < 0.35
    expected = torch.where(X[:, -1] == 1, X[:, dense.f_i_2].all(1), X[:, dense.f_i_1].all(1))
    assert torch.equal(y[:, 0], expected.float())


def test_make_train_as_the_tutorial_calls_it():
    set_seed(4)
    context_length, B_valid = 11, 500
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # s = 2 meets the label window: no warning
        sat_model_s = SelfAttention(context_length, 2)
        data_gen = s_Sparse_AND_Query(context_length, 2)
        results_sat_s = make_train(sat_model_s, data_gen, 300, B_valid, 500, "cpu", "SAT",
                                   verbose=False, etta=1e-2)
    t_loss, t_acc, v_loss, v_acc, model_np = results_sat_s
    assert model_np == get_n_parameters(sat_model_s) == 11 * 2 + 2 * 2 + 2 * 4 + 2 + 11
    assert v_acc > 0.9  # the SAT finds the rule's targets

    # The returned validation figures are BCE and accuracy of the model's outputs.
    X_v, y_v = data_gen.generate(200)
    with torch.no_grad():
        y_hat = sat_model_s(X_v)
    expected_loss = torch.nn.functional.binary_cross_entropy(y_hat.double()[:, 0],
                                                             y_v.double()[:, 0])
    trainer_loss = torch.nn.BCELoss()(y_hat.squeeze(), y_v.squeeze())
    torch.testing.assert_close(trainer_loss.double(), expected_loss, **TIGHT)
    assert bin_acc(y_hat, y_v) == ((y_hat > 0.5).float() == y_v).float().mean().item()

    mlp_model = BinaryMLP(context_length, [64], 1)
    results_mlp_s = make_train(mlp_model, data_gen, 100, B_valid, 20, "cpu", "MLP", etta=1e-3)
    ordered = results_dict(results_sat_s, results_sat_s, results_mlp_s, results_mlp_s)
    assert ordered["Validation Accuracy SAT sparse"] == v_acc
    assert ordered["Number of Parameters MLP dense"] == get_n_parameters(mlp_model)
    assert ordered["Validation Loss SAT dense"] == round(v_loss, 3)


def test_binary_mlp_layers():
    torch.manual_seed(5)
    mlp = BinaryMLP(17, [512], 1)
    assert get_n_parameters(mlp) == 9729
    hidden = mlp.layers[0]
    assert abs(hidden.weight.std().item() - 0.02) < 0.002 and not hidden.bias.any()
    x = torch.randint(0, 2, (8, 17))
    mlp.eval()
    h = torch.nn.functional.gelu(x.double() @ hidden.weight.double().T + hidden.bias.double())
    expected = torch.sigmoid(h @ mlp.layers[3].weight.double().T + mlp.layers[3].bias.double())
    torch.testing.assert_close(mlp(x.float()).double(), expected, **TIGHT)
    torch.testing.assert_close(mlp(x), mlp(x.float()))  # integer bits are read as floats
    deep = BinaryMLP(17, [32, 16], 1)
    assert [type(layer).__name__ for layer in deep.layers] == [
        "Linear", "GELU", "Dropout", "Linear", "GELU", "Dropout", "Linear", "Sigmoid"]


def test_gained_dot_product_attention():
    T = 20
    torch.manual_seed(6)
    x = torch.sin(torch.linspace(0, 2 * math.pi, T)) + 0.1 * torch.randn(T)
    q_1 = 1.0 - torch.sigmoid(torch.linspace(-3, 7, T))
    q_1 = q_1 / q_1.sum()
    q_2 = torch.sigmoid(torch.linspace(-7, 3, T))
    q_2 = q_2 / q_2.sum()
    for z_1, z_2 in ((1.0, 1.0), (10.0, 0.0), (0.0, 10.0)):
        w, y = gained_dot_product_attention(x, q_1, q_2, z_1, z_2)
        expected_w = torch.softmax(z_1 * q_1.double() + z_2 * q_2.double(), dim=0)
        torch.testing.assert_close(w.double(), expected_w, **TIGHT)
        torch.testing.assert_close(y.double(), torch.dot(expected_w, x.double()), **TIGHT)


def test_plotting_helpers_draw(capsys):
    random.seed(7)
    torch.manual_seed(7)
    context_length = 11
    data_gen = s_Sparse_AND_Query(context_length, 2)
    X_, y_ = data_gen.generate(40)
    sat_model = SelfAttention(context_length, 2)
    _, scores, _, _ = sat_model(X_, elaborate=True)

    fig = plot_samples(X_, y_, data_gen.f_i, "samples", show=False)
    assert fig.axes[0].images[0].get_array().shape == (40, 11)
    fig = plot_attention_weights(scores, data_gen.f_i, context_length - 1, y_, show=False)
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == 40 * 10
    fig = plot_attention_weights_stats(scores, data_gen.f_i, context_length - 1, y_, show=False)
    assert fig.axes
    result = (0.1, 0.9, 0.2, 0.8, 65)
    assert len(plot_compare(result, result, result, result, 200, 200, 200, 200,
                            show=False).axes) == 4
    assert plot_loss_accuracy([0.7, 0.5, 0.3], [0.5, 0.7, 0.9], 0.35, 0.85, show=False).axes
    assert plot_weights_and_output(1.0, 5.0, show=False).axes
    assert "output y:" in capsys.readouterr().out
    fig = plot_attention_graph(sat_model, data_gen, 200, show=False)
    assert len(fig.axes) == 2
    assert plot_samples(X_, y_, data_gen.f_i, show=True) is None  # not in IPython


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="integer tokens"):
        SelfAttention(5, 2)(torch.rand(3, 5))
    with pytest.raises(ValueError, match=r"shape \[batch, 5\]"):
        SelfAttention(5, 2)(torch.zeros(3, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="tokens 0 or 1"):
        SelfAttention(5, 2)(torch.full((3, 5), 2))
    with pytest.raises(ValueError, match=r"shape \[T, dm\]"):
        ScaledDotProductAttention(7, 5, 3)(torch.rand(6, 5))
    with pytest.raises(ValueError, match="two disjoint target sets"):
        s_Sparse_AND_Query(5, 3)
    with pytest.raises(ValueError, match="h_dims"):
        BinaryMLP(17, [], 1)
    with pytest.raises(ValueError, match="m must be"):
        s_Sparse_AND(10, 2).generate(0)
    with pytest.raises(ValueError, match="z_1 must be a finite"):
        gained_dot_product_attention(torch.rand(4), torch.rand(4), torch.rand(4), math.inf, 1.0)
