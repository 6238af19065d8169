"""Sparse boolean functions (the Neuromatch attention tutorial): generators, models, training, rule task, gain demo,
plots and the two commands."""

import json
import math

import pytest
import torch
from matplotlib.patches import Rectangle

import reference
from attnlab import cli, plot
from attnlab.tasks import sparse_and as sa

from cli_runner import run_cli


def rows_and_of(bits, target_sets_by_row):
    """Labels computed one sample at a time, independently of the generators' vectorised code."""
    return torch.tensor([float(all(int(row[t]) == 1 for t in targets))
                         for row, targets in zip(bits, target_sets_by_row)])


# ---- generators ----

@pytest.mark.parametrize("seq_len,sparsity", [(17, 2), (17, 4), (6, 3)])
def test_sparse_and_generator_obeys_its_rules(seq_len, sparsity):
    generator = sa.SparseAndGenerator(seq_len, sparsity, seed=3)
    targets = generator.targets.tolist()
    assert len(set(targets)) == sparsity and all(0 <= t < seq_len - 1 for t in targets)
    for n in (200, 500):
        bits, labels = generator.sample(n)
        assert bits.shape == (n, seq_len) and set(bits.unique().tolist()) <= {0, 1}
        assert torch.equal(labels, rows_and_of(bits, [targets] * n))
        assert 0.4 <= labels.mean().item() <= 0.6
        for t in targets:  # no other column equals a target column
            assert not any(torch.equal(bits[:, t], bits[:, o])
                           for o in range(seq_len) if o not in targets)
    assert generator.targets.tolist() == targets  # drawn once per generator


def test_sparse_and_bits_are_one_with_the_spec_probability():
    # Over many draws the per-bit rate of non-target columns approaches 0.5^(1/3) ≈ 0.794
    # (targets are biased by the label window).
    generator = sa.SparseAndGenerator(17, 2, seed=0)
    bits = torch.cat([generator.sample(500)[0] for _ in range(10)])
    others = [c for c in range(17) if c not in generator.targets.tolist()]
    assert abs(bits[:, others].float().mean().item() - 0.5 ** (1 / 3)) < 0.02


def test_rule_generator_obeys_its_rules():
    generator = sa.RuleAndGenerator(11, 2, seed=1)
    first, second = (t.tolist() for t in generator.targets)
    assert len(first) == len(second) == 2 and not set(first) & set(second)
    assert all(0 <= t < 10 for t in first + second)  # the last position is the rule bit
    bits, labels = generator.sample(300)
    assert bits.shape == (300, 11)
    rules = bits[:, -1].tolist()
    assert torch.equal(labels, rows_and_of(bits, [second if z else first for z in rules]))
    assert 0.45 <= labels.mean().item() <= 0.55
    assert 0.35 < bits[:, -1].float().mean().item() < 0.65  # both rules occur


def test_same_seed_same_data_other_seed_other_targets():
    a, b = sa.SparseAndGenerator(17, 2, seed=5), sa.SparseAndGenerator(17, 2, seed=5)
    assert torch.equal(a.sample(50)[0], b.sample(50)[0])
    targets = {tuple(sa.SparseAndGenerator(17, 2, seed=s).targets.tolist()) for s in range(6)}
    assert len(targets) > 1


@pytest.mark.parametrize("make", [lambda: sa.SparseAndGenerator(2, 1, seed=0),
                                  lambda: sa.RuleAndGenerator(3, 1, seed=0)])
def test_retry_limit_gives_a_clear_error(make):
    # One sample has label mean 0 or 1: never inside the window.
    with pytest.raises(sa.GeneratorError, match=r"1 samples with a label mean in .* in 100 draws"):
        make().sample(1)


@pytest.mark.parametrize("call,message", [
    (lambda: sa.SparseAndGenerator(2, 2), "seq_len must be at least sparsity \\+ 1 = 3 .*, got 2"),
    (lambda: sa.SparseAndGenerator(17, 0), "sparsity must be an integer >= 1, got 0"),
    (lambda: sa.SparseAndGenerator(17, -1), "sparsity must be an integer >= 1, got -1"),
    (lambda: sa.SparseAndGenerator(17, 2.0), "sparsity must be an integer >= 1, got 2.0"),
    (lambda: sa.RuleAndGenerator(4, 2), "seq_len must be at least 2 \\* sparsity \\+ 1 = 5 .*, got 4"),
    (lambda: sa.SparseAndGenerator(17, 2).sample(0), "n must be an integer >= 1, got 0"),
    (lambda: sa.SparseAndConfig(seq_len=4, sparsities=(4,)), "seq_len must be at least"),
    (lambda: sa.SparseAndConfig(seeds=0), "seeds must be an integer >= 1, got 0"),
    (lambda: sa.RuleAndConfig(epochs=0), "epochs must be an integer >= 1, got 0"),
    (lambda: sa.gain_weights(math.inf, 1.0), "z1 must be a finite number, got inf"),
    (lambda: sa.gain_inputs(length=1), "length must be an integer >= 2, got 1"),
])
def test_bad_arguments_raise_value_errors_that_name_them(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---- models ----

def test_parameter_counts_at_t17_match_the_spec():
    assert sa.parameter_count(sa.MLP(17)) == 9729
    assert sa.parameter_count(sa.SAT(17)) == 65


def test_sat_attention_goes_through_attnlab_and_matches_a_reference():
    torch.manual_seed(0)
    model = sa.SAT(17, init_std=0.5)  # large weights: a non-uniform attention to compare
    bits, _ = sa.SparseAndGenerator(17, 2).sample(200)
    out = model(bits, elaborate=True)
    x = model.embedding(bits) + model.position
    expected_out, expected_weights = reference.attention(model.W_q(x), model.W_k(x), model.W_v(x))
    assert out.attention.shape == (200, 17, 17) and out.scores.shape == (200, 17)
    torch.testing.assert_close(out.attention.double(), expected_weights, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.scores.double(), expected_out[..., 0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out.probabilities, torch.sigmoid(out.logits))
    torch.testing.assert_close(model(bits), out.probabilities)


@pytest.mark.parametrize("model", [sa.SAT(5), sa.MLP(5)], ids=["SAT", "MLP"])
@pytest.mark.parametrize("bits,message", [
    (torch.zeros(3, 4, dtype=torch.long), r"bits of shape \[batch, 5\], got \[3, 4\]"),
    (torch.zeros(3, 5), "integer bits .* got dtype torch.float32"),
    (torch.full((3, 5), 2), r"0 or 1, got values in \[2, 2\]"),
])
def test_models_reject_bad_bits(model, bits, message):
    with pytest.raises(ValueError, match=message):
        model(bits)


def test_sat_on_two_sparse_and_beats_chance_by_a_wide_margin():
    config = sa.SparseAndConfig(sat_epochs=300, seeds=1, generator="plain")
    run = sa.run_one("SAT", 2, 0, config)
    chance = max(run["val_data"][1].mean().item(), 1 - run["val_data"][1].mean().item())
    assert chance <= 0.6
    assert run["val"]["accuracy"] >= 0.95
    # Its last token attends mostly to the two targets.
    weights = sa.last_token_attention(run["model"], run["val_data"][0])
    assert weights[:, run["generator"].targets].sum(1).mean() > 0.5


def test_same_seed_same_run():
    config = sa.SparseAndConfig(mlp_epochs=20, seeds=1)
    first, second = (sa.run_one("MLP", 2, 4, config) for _ in range(2))
    assert first["train_losses"] == second["train_losses"] and first["val"] == second["val"]


def test_results_table_has_the_four_rows_with_seed_statistics():
    config = sa.SparseAndConfig(seq_len=9, mlp_epochs=5, sat_epochs=5, seeds=2,
                                train_size=100, val_size=100)
    table = sa.results_table(config, first_seed=1, keep_runs=True)
    rows = table["rows"]
    assert [(r["model"], r["s"]) for r in rows] == [("SAT", 2), ("SAT", 4), ("MLP", 2), ("MLP", 4)]
    for row in rows:
        values = [s["val_accuracy"] for s in row["seeds"]]
        assert [s["seed"] for s in row["seeds"]] == [1, 2]
        assert row["val_accuracy_mean"] == pytest.approx(sum(values) / 2)
        assert row["val_accuracy_std"] == pytest.approx(abs(values[0] - values[1]) / math.sqrt(2))
    assert rows[0]["parameters"] == 2 * 2 + 9 * 2 + 4 + 4 + 2 + 9
    assert table["generator"] == "rule-token" and table["seed_list"] == [1, 2]
    assert set(table["runs"]) == {("SAT", 2), ("SAT", 4), ("MLP", 2), ("MLP", 4)}
    text = sa.format_table(rows)
    assert "0.984 / 0.081" in text and len(text.splitlines()) == 5
    json.dumps(sa.table_summary(table))  # what results.json holds is serialisable
    assert set(sa.table_figures(table)) == {"samples_s2", "samples_s4", "attention_s2",
                                            "attention_s4", "results"}


# ---- rule task ----

def test_attention_graph_is_the_tutorials_weights_times_readout():
    # The tutorial's quantity: sum_j softmax(QK^T/sqrt(d))[i, j] * readout[j], averaged over each
    # rule's positive samples; computed here in float64 from the model's parameters.
    torch.manual_seed(0)
    model = sa.SAT(11, init_std=0.3)
    bits, labels = sa.RuleAndGenerator(11, 2, seed=0).sample(300)
    edges = sa.attention_graph(model, bits, labels)
    assert edges.shape == (2, 11)
    x = model.embedding.weight.double()[bits] + model.position.double()
    q, k = x @ model.W_q.weight.double().T, x @ model.W_k.weight.double().T
    weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(2), dim=-1)
    per_sample = (weights * model.readout.weight.double()[0]).sum(-1)      # [B, T]
    for rule in (0, 1):
        chosen = (bits[:, -1] == rule) & (labels == 1)
        torch.testing.assert_close(edges[rule].double(), per_sample[chosen].mean(0),
                                   atol=1e-6, rtol=1e-5)
    # Not the attention output times the readout (what an earlier version plotted).
    output = weights @ (x @ model.W_v.weight.double().T)
    other = (output[..., 0] * model.readout.weight.double()[0])[(bits[:, -1] == 0) & (labels == 1)]
    assert not torch.allclose(edges[0].double(), other.mean(0), atol=1e-4)
    with pytest.raises(ValueError, match="positive samples with rule 1"):
        sa.attention_graph(model, bits[bits[:, -1] == 0], labels[bits[:, -1] == 0])


def test_targets_lead_when_they_stand_out_from_the_rows_level():
    edges = torch.tensor([[-1.0, -1.5, -1.0, -1.4, -1.0, -9.0],  # 1 and 3 stand out below -1
                          [2.5, 2.6, 0.5, 2.4, 1.0, 9.0]])      # 2 and 4 below 2.5 (not 0, 1)
    # The rule token (last) is never a candidate, however far it stands out.
    assert sa.standing_out(edges, 2) == [[1, 3], [2, 4]]
    assert sa.targets_lead(edges, (torch.tensor([1, 3]), torch.tensor([0, 1]))) == [True, False]
    assert sa.targets_lead(edges, (torch.tensor([3, 1]), torch.tensor([4, 2]))) == [True, True]


def test_rule_task_learns_and_draws_its_graph_on_fresh_samples():
    run = sa.run_rule_task(sa.RuleAndConfig(epochs=300), seed=0)
    assert run["val"]["accuracy"] >= 0.85
    assert len(run["targets_lead"]) == 2
    fresh_bits, fresh_labels = run["graph_data"]
    assert len(fresh_bits) == sa.GRAPH_SAMPLES == 200
    assert not any(torch.equal(fresh_bits, data[0][:200]) for data in (run["train_data"],
                                                                        run["val_data"]))
    torch.testing.assert_close(run["edges"], sa.attention_graph(run["model"], fresh_bits,
                                                                fresh_labels))
    assert "rule 0: targets" in sa.format_rule_summary(sa.rule_summary(run, sa.RuleAndConfig(), 0))
    summary = sa.rule_seeds_summary([run, run], sa.RuleAndConfig(), [0, 0])
    lead = run["targets_lead"]
    assert summary["recovered"] == {"rule 0": 2 * lead[0], "rule 1": 2 * lead[1]}
    assert summary["val_accuracy_std"] == 0.0
    assert "rule 0 in" in sa.format_rule_seeds(summary)


# ---- gain demo ----

def test_gain_weights_are_a_softmax_and_sharpen_with_the_gain():
    x, q1, q2 = sa.gain_inputs()
    assert q1.sum().item() == pytest.approx(1) and q2.sum().item() == pytest.approx(1)
    assert q1[0] > q1[-1] and q2[-1] > q2[0]
    w, y = sa.gain_weights(0.0, 0.0)
    torch.testing.assert_close(w, torch.full((20,), 1 / 20))
    assert y.item() == pytest.approx(x.mean().item(), abs=1e-6)

    def entropy(w):
        return -(w * w.log()).sum().item()

    entropies = [entropy(sa.gain_weights(z, 0.0)[0]) for z in (0.0, 2.0, 5.0, 10.0, 50.0)]
    assert entropies == sorted(entropies, reverse=True) and entropies[-1] < entropies[0] - 1
    w, y = sa.gain_weights(3.0, 7.0)
    assert w.sum().item() == pytest.approx(1)
    assert y.item() == pytest.approx(float((w.double() * x.double()).sum()), abs=1e-6)
    assert w[-1] > w[0]  # q₂'s larger gain pulls the weight to the end


# ---- plots ----

def test_boolean_samples_boxes_every_target():
    bits, labels = sa.SparseAndGenerator(9, 3, seed=0).sample(40)
    fig = plot.boolean_samples(bits, labels, [1, 4, 6], count=10)
    boxes = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    assert len(boxes) == 3 and [b.get_x() + 0.5 for b in boxes] == [1, 4, 6]
    assert fig.axes[0].images[0].get_array().shape == (10, 9)
    with pytest.raises(ValueError, match="samples >= 1"):
        plot.boolean_samples(bits[:0], labels[:0], [1])


def test_last_token_attention_and_results_figures():
    weights = torch.rand(30, 8).softmax(-1)
    labels = (torch.arange(30) % 2).float()
    fig = plot.last_token_attention(weights, labels, [2, 5])
    assert len(fig.axes) == 2
    assert all(len([p for p in ax.patches if isinstance(p, Rectangle)]) == 2 for ax in fig.axes)
    with pytest.raises(ValueError, match="one label per sample"):
        plot.last_token_attention(weights, labels[:5], [2])
    rows = [{"model": m, "s": s, "parameters": 65, "val_accuracy_mean": 0.9,
             "val_accuracy_std": 0.01, "val_loss_mean": 0.2, "val_loss_std": 0.05,
             "reference": sa.REFERENCE[(m, s)]} for m in ("SAT", "MLP") for s in (2, 4)]
    fig = plot.sparse_and_results(rows)
    assert [len(ax.patches) for ax in fig.axes] == [4, 4]
    with pytest.raises(ValueError, match="at least one row"):
        plot.sparse_and_results([])


def test_attention_graph_figure_has_one_panel_per_rule_with_an_edge_per_input():
    fig = plot.attention_graph(torch.randn(2, 11), (torch.tensor([0, 1]), torch.tensor([2, 3])))
    assert len(fig.axes) == 2 and all(len(ax.lines) == 11 for ax in fig.axes)
    edges = torch.tensor([[-1.0, -3.0, -1.0, -1.0, -1.0]])  # input 1 stands out below -1
    centred = plot.attention_graph(edges, [[1]], centre=True).axes[0].lines
    assert [line.get_linewidth() for line in centred][:4] == [0.3, 6.3, 0.3, 0.3]
    plain = plot.attention_graph(edges, [[1]]).axes[0].lines
    assert plain[0].get_linewidth() == pytest.approx(0.3 + 6 / 3)


# ---- command line ----


def test_rule_and_command_writes_results_and_the_graph(tmp_path):
    result = run_cli("rule-and", "--fast", "--quiet", "--seeds", "3,5", "--out", str(tmp_path),
                     one_thread=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["seeds"] == [3, 5] and [run["seed"] for run in summary["runs"]] == [3, 5]
    assert all(run["val"]["accuracy"] > 0.85 and len(run["targets_lead"]) == 2
               for run in summary["runs"])
    assert set(summary["recovered"]) == {"rule 0", "rule 1"}
    for name in ("attention_graph", "attention_graph_seed5"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    assert "seed 5: val. accuracy" in result.stdout and "rule 0 in" in result.stdout


def test_sparse_and_command_prints_the_table_and_writes_plots(tmp_path):
    result = run_cli("sparse-and", "--fast", "--seeds", "1", "--seed", "2", "--quiet",
                     "--out", str(tmp_path), one_thread=True)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert len(summary["rows"]) == 4 and summary["first_seed"] == 2
    assert summary["generator"] == "rule-token" and summary["config"]["generator"] == "rule-token"
    s4 = summary["rows"][1]["seeds"][0]["data"]  # the tutorial's fallback, recorded
    assert summary["rows"][1]["s"] == 4 and s4["train"]["window_met"] is False
    assert all(len(row["seeds"]) == 1 for row in summary["rows"])
    for name in ("results", "samples_s2", "attention_s2", "attention_s4"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    assert "SAT" in result.stdout and "0.932 / 3.12" in result.stdout


def test_sample_complexity_command(tmp_path):
    result = run_cli("sparse-and", "--sample-complexity", "--fast", "--sizes", "25,50",
                     "--seeds", "1", "--quiet", "--out", str(tmp_path), one_thread=True)
    assert result.returncode == 0, result.stderr
    sweep = json.loads((tmp_path / "results.json").read_text())
    assert sweep["sizes"] == [25, 50] and set(sweep["models"]) == {"SAT", "MLP"}
    assert all(len(model["seeds"][0]["val_accuracy"]) == 2 for model in sweep["models"].values())
    assert (tmp_path / "sample_complexity.png").stat().st_size > 0
    assert "first size at 100 %" in result.stdout


@pytest.mark.parametrize("args,message", [
    (("sparse-and", "--seeds", "0"), "--seeds must be a count N >= 1"),
    (("sparse-and", "--seeds", "a,b"), "--seeds must be a count N >= 1"),
    (("sparse-and", "--seeds", "1,1"), "--seeds must list distinct seeds"),
    (("sparse-and", "--generator", "dense"), "argument --generator: invalid choice"),
    (("rule-and", "--seeds", "-2"), "--seeds must be a count N >= 1"),
    (("sparse-and", "--sample-complexity", "--sizes", "50,25"), "--sizes must be increasing"),
    (("sparse-and", "--sample-complexity", "--sizes", "a"), "--sizes must be increasing"),
    (("sparse-and", "--sample-complexity", "--sparsity", "0"), "--sparsity must be at least 1"),
])
def test_bad_command_line_exits_nonzero_with_one_line(args, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1


def test_bad_command_line_in_a_process_has_no_traceback():
    result = run_cli("sparse-and", "--seeds", "0")
    assert result.returncode == 2 and "--seeds must be a count N >= 1" in result.stderr
    assert "Traceback" not in result.stderr


# ---- the tutorial's generator and loss, and agreement with its trainer ----

def test_table_runs_on_the_tutorials_rule_token_generator_by_default():
    assert sa.SparseAndConfig().generator == sa.default_config().generator == "rule-token"
    config = sa.SparseAndConfig(sat_epochs=2, mlp_epochs=2, seeds=1)
    run = sa.run_one("SAT", 2, 0, config)
    assert isinstance(run["generator"], sa.RuleAndGenerator)
    bits, labels = run["train_data"]
    first, second = (t.tolist() for t in run["generator"].targets)
    assert bits.shape == (200, 17) and max(first + second) < 16  # 16 bits, then the rule bit
    assert torch.equal(labels, rows_and_of(bits, [second if z else first for z in bits[:, -1]]))
    assert run["data_draws"]["train"]["window_met"] is True
    plain = sa.run_one("SAT", 2, 0, sa.SparseAndConfig(sat_epochs=2, seeds=1, generator="plain"))
    assert isinstance(plain["generator"], sa.SparseAndGenerator)
    with pytest.raises(ValueError, match="generator must be one of rule-token, plain"):
        sa.SparseAndConfig(generator="dense")
    with pytest.raises(ValueError, match="seq_len must be at least 9 for the rule-token"):
        sa.SparseAndConfig(seq_len=8, sparsities=(4,))


def test_rule_token_generator_keeps_its_last_draw_for_s4_as_the_tutorial():
    seed, n = 7, 500
    generator = sa.RuleAndGenerator(17, 4, seed=seed, keep_last_draw=True)
    bits, labels = generator.sample(n)
    assert generator.last_sample == {"label_mean": labels.mean().item(), "window_met": False,
                                     "draws": 100}
    assert 0.15 < labels.mean().item() < 0.35  # p^4 = 0.25
    # The draws, replayed in the test: targets from a permutation of the 16 bit positions, then
    # the rule bits once for the call, then 100 draws of the 16 bits; the last one is kept.
    replay = torch.Generator().manual_seed(seed)
    order = torch.randperm(16, generator=replay)
    assert generator.targets[0].tolist() == sorted(order[:4].tolist())
    assert generator.targets[1].tolist() == sorted(order[4:8].tolist())
    rule = torch.rand(n, 1, generator=replay) < 0.5
    for _ in range(100):
        inputs = torch.rand(n, 16, generator=replay) < 0.5 ** 0.5
    assert torch.equal(bits, torch.cat([inputs, rule], 1).long())
    with pytest.raises(sa.GeneratorError, match="in 100 draws"):
        sa.RuleAndGenerator(17, 4, seed=seed).sample(n)  # without the fallback: an error


def test_tutorial_bce_is_bceloss_on_the_sigmoid_with_its_clamp():
    logits = torch.tensor([-200.0, -3.0, 0.5, 4.0, 200.0])
    labels = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    expected = torch.nn.BCELoss()(torch.sigmoid(logits), labels)
    assert sa.tutorial_bce(logits, labels).item() == pytest.approx(expected.item(), rel=1e-6)
    # Two confidently wrong samples cost 100 each (the clamped log), not 200 as with logits.
    terms = [100.0, math.log1p(math.exp(-3.0)), math.log1p(math.exp(-0.5)),
             math.log1p(math.exp(-4.0)), 100.0]
    assert sa.tutorial_bce(logits, labels).item() == pytest.approx(sum(terms) / 5, rel=1e-5)


@pytest.mark.parametrize("model_name", ["SAT", "MLP"])
def test_task_training_measures_what_the_tutorials_make_train_measures(model_name):
    # Same data, same initial weights, same seed for dropout: the experiment's full-batch loop
    # and the tutorial's Trainer (through attnlab.tutorials.neuromatch) end at the same
    # validation accuracy and loss.
    from attnlab.tutorials import neuromatch as nm
    generator = sa.RuleAndGenerator(17, 2, seed=3)
    train, val = generator.sample(200), generator.sample(500)
    torch.manual_seed(0)
    ours = sa.MODELS[model_name](17)
    if model_name == "SAT":
        theirs = nm.SelfAttention(17, 2)
        pairs = [("embedding.weight", "tokenizer.weight"), ("position", "positioner"),
                 ("W_q.weight", "Wq.weight"), ("W_k.weight", "Wk.weight"),
                 ("W_v.weight", "Wv.weight"), ("readout.weight", "linear.weight")]
        epochs, lr = 60, 1e-2
    else:
        theirs = nm.BinaryMLP(17, [512], 1)
        pairs = [("net.0.weight", "layers.0.weight"), ("net.0.bias", "layers.0.bias"),
                 ("net.3.weight", "layers.3.weight"), ("net.3.bias", "layers.3.bias")]
        epochs, lr = 30, 1e-3
    theirs.load_state_dict({their: ours.state_dict()[our] for our, their in pairs})
    torch.manual_seed(11)
    result = sa.train_full_batch(ours, train, val, epochs, lr)
    torch.manual_seed(11)
    trainer = nm.Trainer(theirs, torch.optim.Adam(theirs.parameters(), lr=lr), torch.nn.BCELoss())
    x_train, x_val = (train[0], val[0]) if model_name == "SAT" else (train[0].float(), val[0].float())
    trainer.do_train(epochs, x_train, train[1])
    loss, accuracy = trainer.do_eval(x_val, val[1])
    assert result["val"]["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert result["val"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_mlp_initialisation_is_the_tutorials():
    torch.manual_seed(5)
    mlp = sa.MLP(17)
    hidden, output = mlp.net[0], mlp.net[3]
    assert abs(hidden.weight.std().item() - 0.02) < 0.002 and not hidden.bias.any()
    # The output layer keeps PyTorch's default: uniform in ±1/sqrt(512), bias too.
    bound = 1 / math.sqrt(512)
    assert output.weight.abs().max() <= bound and output.weight.std().item() > 0.02
    assert output.bias.abs().item() <= bound and output.bias.item() != 0


# ---- Exercise 3.4 ----

def test_sample_complexity_finds_the_first_size_at_100_percent(monkeypatch):
    accuracies = {("SAT", 0): [0.9, 1.0, 0.99, 1.0], ("SAT", 1): [0.8, 0.95, 1.0, 1.0],
                  ("MLP", 0): [0.7, 0.8, 0.9, 0.99], ("MLP", 1): [0.7, 0.8, 0.9, 1.0]}
    sizes = [10, 20, 40, 80]

    def fake_run(model_name, sparsity, seed, config, progress=False, device=None):
        return {"val": {"accuracy": accuracies[(model_name, seed)][sizes.index(config.train_size)]}}

    monkeypatch.setattr(sa, "run_one", fake_run)
    sweep = sa.sample_complexity(sa.SparseAndConfig(seeds=2), sizes=sizes, seeds=[0, 1])
    sat, mlp = sweep["models"]["SAT"], sweep["models"]["MLP"]
    assert [run["first_size_at_100"] for run in sat["seeds"]] == [20, 40]
    assert sat["first_size_at_100_mean"] == 30 and sat["first_size_at_100_std"] == pytest.approx(
        math.sqrt(200))
    assert [run["first_size_at_100"] for run in mlp["seeds"]] == [None, 80]
    assert mlp["reached_100"] == 1 and mlp["first_size_at_100_mean"] == 80
    assert sat["val_accuracy_mean"] == pytest.approx([0.85, 0.975, 0.995, 1.0])
    text = sa.format_sample_complexity(sweep)
    assert "seed 0: not reached" in text and "30 ± 14" in text
    figure = plot.sample_complexity(sweep)
    assert len(figure.axes) == 1 and figure.axes[0].get_xscale() == "log"
    with pytest.raises(ValueError, match="sizes must be increasing"):
        sa.sample_complexity(sa.SparseAndConfig(), sizes=[50, 25], seeds=[0])


def test_sample_complexity_trains_for_real():
    config = sa.SparseAndConfig(sat_epochs=100, mlp_epochs=50, val_size=100)
    sweep = sa.sample_complexity(config, sizes=[30, 60], seeds=[0], sparsity=2)
    for model in sweep["models"].values():
        assert all(0.4 < accuracy <= 1 for accuracy in model["seeds"][0]["val_accuracy"])
