"""The training loop, the reversal experiment and the experiment command line."""

import dataclasses
import json

import pytest
import torch

from attnlab.tasks import reverse
from attnlab.train import CheckpointError, TrainConfig, fit

from cli_runner import run_cli
from interruption import interrupt_during


def small_config(seed=0, epochs=2):
    return reverse.ReverseConfig(train_size=1280, val_size=200, test_size=200,
                                 train=TrainConfig(epochs=epochs, seed=seed))


def test_reverse_fast_reaches_99_percent_and_writes_results(tmp_path):
    result = run_cli("reverse", "--fast", "--quiet", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["test"]["accuracy"] >= 0.99
    assert summary["config"]["train"]["epochs"] == 6 and len(summary["history"]) == 6
    validation = [epoch["accuracy"] for epoch in summary["history"]]
    assert summary["selected_epoch"] == validation.index(max(validation)) + 1
    assert summary["val"]["accuracy"] == validation[summary["selected_epoch"] - 1]
    for name in ("attention.png", "training.png", "checkpoint.pt"):
        assert (tmp_path / name).stat().st_size > 0
    assert "test accuracy" in result.stdout


def test_reverse_attention_is_anti_diagonal_after_training(tmp_path):
    task = reverse.make_task(reverse.fast_config())
    fit(task, reverse.fast_config().train, progress=False)
    maps, tokens = reverse.attention_example(task)
    assert len(maps) == 1 and maps[0].shape == (1, 1, 16, 16) and len(tokens) == 16
    # Each query i puts its largest weight on key 15 - i.
    assert torch.equal(maps[0][0, 0].argmax(-1), torch.arange(15, -1, -1))


def test_same_seed_same_result():
    first = fit(reverse.make_task(small_config(seed=3)), small_config(seed=3).train, progress=False)
    second = fit(reverse.make_task(small_config(seed=3)), small_config(seed=3).train, progress=False)
    assert first["history"] == second["history"]  # bitwise: losses and accuracies
    assert first["test"] == second["test"]


def test_interrupted_run_resumes_to_the_same_metrics(tmp_path):
    config = small_config(seed=5, epochs=3)
    uninterrupted = fit(reverse.make_task(config), config.train, out_dir=tmp_path / "a",
                        progress=False)

    task = interrupt_during(reverse.make_task(config), epoch=1, batch=3)
    with pytest.raises(KeyboardInterrupt):
        fit(task, config.train, out_dir=tmp_path / "b", progress=False)
    assert torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)["epoch"] == 1

    resumed = fit(reverse.make_task(config), config.train, out_dir=tmp_path / "b", progress=False)
    assert resumed["history"] == uninterrupted["history"]  # bitwise
    assert resumed["test"] == uninterrupted["test"]


def test_checkpoint_of_another_configuration_is_refused(tmp_path):
    fit(reverse.make_task(small_config(epochs=1)), small_config(epochs=1).train,
        out_dir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="another configuration"):
        fit(reverse.make_task(small_config(epochs=2)), small_config(epochs=2).train,
            out_dir=tmp_path, progress=False)


def test_cli_unreadable_checkpoint_is_one_line_and_nonzero(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    result = run_cli("reverse", "--fast", "--quiet", "--out", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip().startswith("attnlab reverse: error: cannot read checkpoint")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_cli_bad_epochs_exit_nonzero():
    result = run_cli("reverse", "--epochs", "0")
    assert result.returncode == 2 and "--epochs must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_config_validation():
    with pytest.raises(ValueError, match="epochs must be at least 1"):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match="train_size \\(100\\) must hold at least one batch"):
        reverse.ReverseConfig(train_size=100)
    assert dataclasses.asdict(reverse.default_config())["train"]["epochs"] == 10


def peaked_task(select_best="accuracy"):
    """One weight w that every step raises by about the learning rate (Adam on loss = -w);
    validation accuracy 1 - (w - 0.2)², highest after the second of three steps; the "test"
    split reports w itself, so it tells which weights were measured."""
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)

    def evaluate(model, split):
        w = model.weight.item()
        return {"accuracy": 1 - (w - 0.2) ** 2} if split == "val" else {"accuracy": w}

    from attnlab.train import Task
    return Task(name="peaked", model=model, batches_per_epoch=1,
                train_batches=lambda epoch, generator: iter([(torch.ones(1, 1), None)]),
                loss=lambda output, target: -output.sum(), evaluate=evaluate,
                select_best=select_best)


def test_final_splits_are_measured_on_the_best_validation_epoch(tmp_path):
    config = TrainConfig(epochs=3, lr=0.1, warmup=1, schedule="constant", grad_clip=None)
    result = fit(peaked_task(), config, out_dir=tmp_path, progress=False)
    assert [round(epoch["accuracy"], 6) for epoch in result["history"]] == [0.99, 1.0, 0.99]
    assert result["selected_epoch"] == 2 and result["selected_by"] == "best validation accuracy"
    assert result["test"]["accuracy"] == pytest.approx(0.2, abs=1e-6)  # w after step 2, not 3
    assert result["val"]["accuracy"] == result["history"][1]["accuracy"]
    # A finished run read back from its checkpoint gives the same, best, figures.
    again = fit(peaked_task(), config, out_dir=tmp_path, progress=False)
    assert again["test"] == result["test"] and again["selected_epoch"] == 2
    # Without select_best: the last epoch's weights.
    last = fit(peaked_task(select_best=None), config, progress=False)
    assert last["test"]["accuracy"] == pytest.approx(0.3, abs=1e-6)
    assert "selected_epoch" not in last
    with pytest.raises(KeyError, match="select_best names the validation metric 'loss'"):
        fit(peaked_task(select_best="loss"), config, progress=False)


def test_best_epoch_survives_an_interruption(tmp_path):
    config = small_config(seed=6, epochs=3)
    uninterrupted = fit(reverse.make_task(config), config.train, out_dir=tmp_path / "a",
                        progress=False)
    task = interrupt_during(reverse.make_task(config), epoch=2, batch=2)
    with pytest.raises(KeyboardInterrupt):
        fit(task, config.train, out_dir=tmp_path / "b", progress=False)
    resumed = fit(reverse.make_task(config), config.train, out_dir=tmp_path / "b", progress=False)
    assert resumed["selected_epoch"] == uninterrupted["selected_epoch"]
    assert resumed["test"] == uninterrupted["test"]


def test_cli_seeds_writes_each_run_and_a_summary(tmp_path):
    result = run_cli("reverse", "--fast", "--epochs", "1", "--seeds", "3,5", "--quiet",
                     "--out", str(tmp_path), one_thread=True)
    assert result.returncode == 0, result.stderr
    runs = [json.loads((tmp_path / f"seed-{seed}" / "results.json").read_text())
            for seed in (3, 5)]
    assert [run["config"]["train"]["seed"] for run in runs] == [3, 5]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == [3, 5] and len(summary["runs"]) == 2
    values = [run["test"]["accuracy"] for run in runs]
    stats = summary["metrics"]["test"]["accuracy"]
    assert stats["values"] == values and stats["mean"] == pytest.approx(sum(values) / 2)
    assert stats["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)
    assert "2 seeds (3, 5)" in result.stdout and "test: accuracy" in result.stdout


def test_seed_list_reads_a_count_or_a_list():
    from attnlab.cli import seed_list
    assert seed_list("3", 2) == [2, 3, 4]
    assert seed_list("0,1,2,3,4", 9) == [0, 1, 2, 3, 4]
    assert seed_list("7,", 0) == [7]
    for bad in ("0", "x", "1,1", "-1,2", ""):
        with pytest.raises(ValueError, match="--seeds must"):
            seed_list(bad, 0)
