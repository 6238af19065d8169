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
