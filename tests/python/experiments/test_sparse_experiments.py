"""--normalizer in the reverse, anomaly and permutation experiments, and the fraction of exact
zeros in their attention maps (attention_zero_fraction). Tiny configurations: seconds."""

import dataclasses
import json
import statistics

import pytest
import torch

from attnlab import cli
from attnlab.nn import AdditiveAttention, ScaledDotProductAttention
from attnlab.tasks import anomaly, permutation, reverse
from attnlab.tasks.sparsity import attention_zero_counts

import reference as ref
from cli_runner import run_cli

NORMALIZERS = ("softmax", "sparsemax", "entmax15")
NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_reverse(seed=0):
    return reverse.ReverseConfig(seq_len=6, train_size=256, val_size=32, test_size=48,
                                 batch_size=32, model_dim=8,
                                 train=dataclasses.replace(reverse.ReverseConfig().train,
                                                           epochs=1, warmup=2, seed=seed))


def tiny_permutation(seed=0):
    return permutation.PermutationConfig(
        n=4, embed_dim=8, additive_hidden=8, batches_per_epoch=6, batch_size=16, val_size=20,
        test_size=30, train=dataclasses.replace(permutation.PermutationConfig().train,
                                                epochs=1, warmup=2, seed=seed))


def tiny_anomaly(seed=0):
    return anomaly.AnomalyConfig(model_dim=16, num_heads=2, num_layers=2, batch_size=16,
                                 sets_per_epoch=32,
                                 train=dataclasses.replace(anomaly.AnomalyConfig().train,
                                                           epochs=1, warmup=2, seed=seed))


def fake_anomaly_data(monkeypatch):
    """Random features of 4 classes instead of the Fashion-MNIST ones (and random images for
    the figures), so that the anomaly task builds in a second."""
    generator = torch.Generator().manual_seed(5)

    def split(per_class):
        labels = torch.arange(4).repeat_interleave(per_class)
        return torch.randn(len(labels), 12, generator=generator) + labels[:, None], labels

    features = {"train": split(100), "test": split(30), "classes": ["a", "b", "c", "d"]}
    monkeypatch.setattr(anomaly, "load_features", lambda *args, **kwargs: features)
    monkeypatch.setattr(anomaly, "load_images", lambda config, name: torch.randint(
        256, (len(features[name][1]), 8, 8), dtype=torch.uint8))


@pytest.fixture
def tiny_configs(monkeypatch):
    """The experiments' --fast configurations replaced by tiny ones, for in-process CLI runs."""
    for module, make in ((reverse, tiny_reverse), (permutation, tiny_permutation),
                         (anomaly, tiny_anomaly)):
        monkeypatch.setattr(module, "fast_config", make)
    fake_anomaly_data(monkeypatch)


# The command line ------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["reverse", "anomaly", "permutation"])
def test_cli_takes_the_three_normalizers(command):
    parser = cli.build_parser()
    assert parser.parse_args([command]).normalizer is None  # the config's default: softmax
    for normalizer in NORMALIZERS:
        assert parser.parse_args([command, "--normalizer", normalizer]).normalizer == normalizer


@pytest.mark.parametrize("command", ["reverse", "anomaly", "permutation"])
def test_cli_refuses_another_normalizer_naming_the_option(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args([command, "--normalizer", "entmax"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "argument --normalizer: invalid choice: 'entmax'" in error
    assert "softmax" in error and "sparsemax" in error and "entmax15" in error


def test_cli_bad_normalizer_in_a_child_process_is_one_line_exit_2():
    result = run_cli("reverse", "--normalizer", "hard", one_thread=True)
    assert result.returncode == 2
    assert "--normalizer: invalid choice: 'hard'" in result.stderr
    assert "Traceback" not in result.stderr


def test_configs_refuse_an_unknown_normalizer_naming_it():
    for make in (tiny_reverse, tiny_permutation, tiny_anomaly):
        with pytest.raises(ValueError, match=r"normalizer must be one of softmax, sparsemax, "
                                             r"entmax15, got 'entmax'"):
            dataclasses.replace(make(), normalizer="entmax")


# The normalizer reaches the models --------------------------------------------------------------

def test_reverse_model_uses_the_normalizer():
    for normalizer in NORMALIZERS:
        task = reverse.make_task(dataclasses.replace(tiny_reverse(), normalizer=normalizer))
        layers = task.model.transformer.layers
        assert [layer.self_attn.normalizer for layer in layers] == [normalizer] * len(layers)


def test_anomaly_model_uses_the_normalizer(monkeypatch):
    fake_anomaly_data(monkeypatch)
    task = anomaly.make_task(dataclasses.replace(tiny_anomaly(), normalizer="entmax15"),
                             progress=False)
    assert [layer.self_attn.normalizer for layer in task.model.transformer.layers] == \
        ["entmax15", "entmax15"]


def test_sparsemax_maps_have_exact_zeros_and_softmax_maps_none():
    inputs = reverse.one_hot(torch.randint(10, (16, 6), generator=torch.Generator()
                                           .manual_seed(1)), 10)
    zeros = {}
    for normalizer in NORMALIZERS:
        task = reverse.make_task(dataclasses.replace(tiny_reverse(), normalizer=normalizer))
        with torch.no_grad():  # larger weights: scores far apart, as after training
            task.model.transformer.layers[0].self_attn.qkv_proj.weight.mul_(8)
        (weights,) = task.model.get_attention_maps(inputs)
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-5)
        zeros[normalizer] = int((weights == 0).sum())
    assert zeros["softmax"] == 0
    assert zeros["sparsemax"] > 0 and zeros["entmax15"] > 0
    assert zeros["sparsemax"] >= zeros["entmax15"]  # sparsemax is the sparser of the two


# Permutation: every attention kind with every normalizer ----------------------------------------

@pytest.mark.parametrize("kind", permutation.ATTENTION_KINDS)
@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_permutation_kinds_normalize_their_scores_with_the_normalizer(kind, normalizer):
    torch.manual_seed(0)
    model = permutation.PermutationModel(n=5, embed_dim=8, attention=kind, autoregressive=True,
                                         additive_hidden=8, normalizer=normalizer).double()
    assert model.attention.normalizer == normalizer
    with torch.no_grad():  # larger scores, so that the sparse normalizers leave zeros
        for parameter in model.lstm.parameters():
            parameter.mul_(3)
        if kind == "additive":
            model.attention.w3.weight.mul_(6)
    digits, _ = permutation.permutation_batch(3, 5, torch.Generator().manual_seed(2))
    logits = model(digits)
    weights = model.attention.last_weights
    # The scores again, from the layer's get_scores, and the test's own normalizers (float64).
    with torch.no_grad():
        objects = model.positions(model.embedding(digits))
        queries, _ = model.lstm(objects)
        scores = model.attention.get_scores(objects, queries)
    allowed = torch.ones(10, 10, dtype=torch.bool).tril()
    scores = scores.masked_fill(~allowed, NEG_INF)
    expected = (scores.softmax(-1) if normalizer == "softmax"
                else ref.normalize(scores, ref.alpha_of(normalizer))[0])
    torch.testing.assert_close(weights, expected, rtol=1e-9, atol=1e-12)
    assert (weights[:, ~allowed] == 0).all()
    open_zeros = int(((weights == 0) & allowed).sum())
    assert (open_zeros == 0) if normalizer == "softmax" else (open_zeros > 0)
    # It trains: every parameter gets a finite gradient.
    logits.sum().backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("normalizer", ["sparsemax", "entmax15"])
def test_additive_attention_gradient_through_the_sparse_normalizers(normalizer):
    torch.manual_seed(3)
    layer = AdditiveAttention(3, 4, 5, normalizer=normalizer).double()
    with torch.no_grad():
        layer.w3.weight.mul_(4)
    features = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    queries = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(4, 5, dtype=torch.bool).tril()
    assert torch.autograd.gradcheck(lambda f, q: layer.attend(f, q, mask), (features, queries))


def test_attention_layers_refuse_a_bad_normalizer_naming_it():
    with pytest.raises(ValueError, match="unknown normalizer 'hardmax'"):
        ScaledDotProductAttention(normalizer="hardmax")
    with pytest.raises(ValueError, match="unknown normalizer 'hardmax'"):
        AdditiveAttention(3, 3, 3, normalizer="hardmax")
    with pytest.raises(ValueError, match="normalizer='entmax' needs alpha"):
        permutation.PermutationModel(n=3, embed_dim=4, normalizer="entmax")


def test_permutation_variant_and_folder_name_the_normalizer():
    config = dataclasses.replace(tiny_permutation(), autoregressive=True, normalizer="sparsemax")
    assert config.variant == "scaled-add-autoregressive-sparsemax"
    assert permutation.run_name(config) == "permutation-scaled-add-autoregressive-sparsemax"
    softmax = dataclasses.replace(config, normalizer="softmax")
    assert permutation.run_name(softmax) == "permutation-scaled-add-autoregressive"
    assert reverse.run_name(tiny_reverse()) == "reverse"
    assert reverse.run_name(dataclasses.replace(tiny_reverse(), normalizer="entmax15")) == \
        "reverse-entmax15"
    assert anomaly.run_name(dataclasses.replace(tiny_anomaly(), normalizer="sparsemax")) == \
        "anomaly-sparsemax"


# The zero fraction ----------------------------------------------------------------------------

def count_zeros(maps, allowed=None):
    """The test's own count: Python loops over every weight of every map."""
    zeros = total = 0
    for weights in maps:
        for index, value in enumerate(weights.flatten().tolist()):
            query, key = divmod(index % (weights.shape[-2] * weights.shape[-1]),
                                weights.shape[-1])
            if allowed is not None and not allowed[query][key]:
                continue
            total += 1
            zeros += value == 0.0
    return zeros, total


def test_attention_zero_counts_against_a_loop_count():
    weights = torch.tensor([[[0.0, 1.0, 0.0], [0.25, 0.75, 0.0]],
                            [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]])
    assert attention_zero_counts([weights]) == (6, 12) == count_zeros([weights])
    allowed = torch.tensor([[True, False, False], [True, True, True]])
    assert attention_zero_counts([weights], allowed) == (4, 8) == \
        count_zeros([weights], allowed.tolist())
    assert attention_zero_counts([weights, weights[:1]], allowed) == (6, 12)


def test_reverse_zero_fraction_is_the_share_of_exact_zeros_in_the_test_maps():
    config = dataclasses.replace(tiny_reverse(), normalizer="sparsemax")
    task = reverse.make_task(config)
    with torch.no_grad():
        task.model.transformer.layers[0].self_attn.qkv_proj.weight.mul_(8)
    metrics = task.evaluate(task.model, "test")
    # The test split, drawn again as make_task draws it (train, val, then test).
    generator = torch.Generator().manual_seed(config.train.seed + 1)
    for size in (config.train_size, config.val_size):
        torch.randint(config.num_classes, (size, config.seq_len), generator=generator)
    digits = torch.randint(config.num_classes, (config.test_size, config.seq_len),
                           generator=generator)
    maps = task.model.get_attention_maps(reverse.one_hot(digits, config.num_classes))
    zeros, total = count_zeros(maps)
    assert total == config.test_size * config.seq_len ** 2
    assert 0 < zeros < total
    assert metrics["attention_zero_fraction"] == pytest.approx(zeros / total, abs=1e-12)


def test_permutation_zero_fraction_counts_the_open_keys_of_the_answer_rows():
    config = dataclasses.replace(tiny_permutation(), autoregressive=True, normalizer="sparsemax")
    task = permutation.make_task(config)
    with torch.no_grad():
        for parameter in task.model.lstm.parameters():
            parameter.mul_(3)
    metrics = task.evaluate(task.model, "test")
    inputs, _ = permutation.permutation_batch(config.test_size, config.n,
                                              torch.Generator().manual_seed(20_000))
    n = config.n
    answers = task.model.attention_map(inputs)[:, n:]  # rows n..2n-1
    open_keys = [[key <= n + row for key in range(2 * n)] for row in range(n)]
    zeros, total = count_zeros([answers], open_keys)
    assert total == config.test_size * sum(n + row + 1 for row in range(n))
    assert 0 < zeros < total
    assert metrics["attention_zero_fraction"] == pytest.approx(zeros / total, abs=1e-12)
    softmax_task = permutation.make_task(dataclasses.replace(config, normalizer="softmax"))
    assert softmax_task.evaluate(softmax_task.model, "test")["attention_zero_fraction"] == 0


def test_anomaly_zero_fraction_counts_every_layer_and_head(monkeypatch):
    fake_anomaly_data(monkeypatch)
    task = anomaly.make_task(dataclasses.replace(tiny_anomaly(), normalizer="sparsemax"),
                             progress=False)
    metrics = task.evaluate(task.model, "test")
    sets = task.examples["test_sets"]
    task.model.eval()
    maps = task.model.get_attention_maps(task.examples["test_features"][sets])
    zeros, total = count_zeros(maps)
    assert total == len(sets) * 2 * 2 * 10 * 10  # sets × layers × heads × 10 × 10
    assert metrics["attention_zero_fraction"] == pytest.approx(zeros / total, abs=1e-12)
    assert 0 < zeros


# Runs, summaries and resuming -------------------------------------------------------------------

def test_cli_run_writes_the_normalizer_and_zero_fraction(tiny_configs, tmp_path, monkeypatch,
                                                         capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["reverse", "--fast", "--normalizer", "sparsemax", "--quiet"]) == 0
    out = tmp_path / "runs" / "reverse-sparsemax-fast"  # its own default folder
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["normalizer"] == "sparsemax"
    assert 0 <= results["test"]["attention_zero_fraction"] <= 1
    line = capsys.readouterr().out
    assert (f"test attention_zero_fraction "
            f"{100 * results['test']['attention_zero_fraction']:.2f} %") in line
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["task"] == "reverse (sparsemax)"


@pytest.mark.parametrize("command", ["reverse", "permutation", "anomaly"])
def test_seed_summary_includes_the_zero_fraction(command, tiny_configs, tmp_path, capsys):
    out = tmp_path / command
    assert cli.main([command, "--fast", "--normalizer", "entmax15", "--seeds", "2", "--quiet",
                     "--out", str(out)]) == 0
    runs = [json.loads((out / f"seed-{seed}" / "results.json").read_text()) for seed in (0, 1)]
    values = [run["test"]["attention_zero_fraction"] for run in runs]
    assert all(run["config"]["normalizer"] == "entmax15" for run in runs)
    summary = json.loads((out / "summary.json").read_text())
    stats = summary["metrics"]["test"]["attention_zero_fraction"]
    assert stats["values"] == values
    assert stats["mean"] == pytest.approx(statistics.fmean(values))
    assert stats["std"] == pytest.approx(statistics.stdev(values))
    assert summary["config"]["normalizer"] == "entmax15"
    printed = capsys.readouterr().out
    assert (f"attention_zero_fraction {100 * stats['mean']:.2f} ± {100 * stats['std']:.2f} %"
            in printed)


@pytest.mark.parametrize("command", ["reverse", "permutation"])
def test_resume_with_another_normalizer_is_refused(command, tiny_configs, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli.main([command, "--fast", "--quiet", "--out", out]) == 0
    capsys.readouterr()
    assert cli.main([command, "--fast", "--normalizer", "sparsemax", "--quiet",
                     "--out", out]) == 1
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "is not a checkpoint of the" in error and "sparsemax" in error
    assert "use another --out folder" in error
    # and the other way round
    out2 = str(tmp_path / "run2")
    assert cli.main([command, "--fast", "--normalizer", "entmax15", "--quiet", "--out", out2]) == 0
    capsys.readouterr()
    assert cli.main([command, "--fast", "--quiet", "--out", out2]) == 1
    error = capsys.readouterr().err
    assert "written by the" in error and "entmax15" in error  # names what it was written with


# The side-by-side figure ----------------------------------------------------------------------

def test_attention_side_by_side_draws_exact_zeros_blank():
    from attnlab import plot
    sparse = torch.tensor([[1.0, 0.0, 0.0], [0.25, 0.75, 0.0]])
    dense = torch.tensor([[0.5, 0.25, 0.25], [0.2, 0.3, 0.5]])
    figure = plot.attention_side_by_side({"sparse": sparse, "dense": dense}, ["a", "b"],
                                         ["x", "y", "z"], marked=[(1, 1)])
    axes = [ax for ax in figure.axes if ax.images and ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["sparse\n50 % exact zeros",
                                               "dense\n0 % exact zeros"]
    drawn = axes[0].images[0].get_array()
    assert drawn.mask.tolist() == (sparse == 0).tolist()  # the zeros are not coloured
    assert not axes[1].images[0].get_array().mask.any()
    assert len(axes[0].patches) == 1  # the framed cell


def test_attention_side_by_side_refuses_bad_maps():
    from attnlab import plot
    with pytest.raises(ValueError, match="needs at least one map"):
        plot.attention_side_by_side({})
    with pytest.raises(ValueError, match=r"maps \[queries, keys\] of one shape"):
        plot.attention_side_by_side({"a": torch.ones(2, 3), "b": torch.ones(3, 3)})
    with pytest.raises(ValueError, match=r"marked cell \(2, 0\) is outside the 2×3 map"):
        plot.attention_side_by_side({"a": torch.ones(2, 3)}, marked=[(2, 0)])
