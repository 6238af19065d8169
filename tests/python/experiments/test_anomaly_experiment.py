"""The set-anomaly experiment on the real Fashion-MNIST (Debian's dataset-fashion-mnist)."""

import dataclasses
import json
import math

import pytest
import torch

from attnlab import cli
from attnlab.data import FASHION_MNIST_DIR
from attnlab.models import TransformerPredictor
from attnlab.tasks import anomaly

from cli_runner import run_cli

needs_data = pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(),
                                reason="Debian's dataset-fashion-mnist is not installed")


def check_run_folder(out):
    """results.json and the figures of an anomaly run; returns the summary."""
    summary = json.loads((out / "results.json").read_text())
    # The figures are those of the best validation epoch's weights, as the tutorial's are.
    validation = [epoch["accuracy"] for epoch in summary["history"]]
    assert summary["selected_by"] == "best validation accuracy"
    assert summary["selected_epoch"] == validation.index(max(validation)) + 1
    assert summary["val"]["accuracy"] == validation[summary["selected_epoch"] - 1]
    for name in ("attention.png", "training.png", "sets.png", "mistakes.png"):
        assert (out / name).stat().st_size > 0
    return summary


def small_config(seed=0):
    """--fast shrunk to seconds: a 2-layer, 32-wide model, 3 epochs of 640 sets. What it checks
    is the run from the real data to the figures, not the accuracy of the recipe."""
    return anomaly.AnomalyConfig(
        model_dim=32, num_heads=4, num_layers=2, sets_per_epoch=640,
        train=dataclasses.replace(anomaly.AnomalyConfig().train, epochs=3, warmup=5, seed=seed))


@needs_data
def test_anomaly_runs_on_fashion_mnist_and_its_loss_falls(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(anomaly, "fast_config", small_config)
    assert cli.main(["anomaly", "--fast", "--quiet", "--out", str(tmp_path)]) == 0
    assert "test accuracy" in capsys.readouterr().out
    summary = check_run_folder(tmp_path)
    assert summary["config"]["model_dim"] == 32 and len(summary["history"]) == 3
    assert summary["steps_per_epoch"] == 10
    losses = [epoch["train_loss"] for epoch in summary["history"]]
    # From about ln 10 (no idea which of the ten is the odd one) down.
    assert losses[0] < math.log(10) + 0.1 and losses[-1] < losses[0] - 0.05, losses
    # Well above chance (1 in 10): the features, sets and labels line up.
    assert summary["test"]["accuracy"] > 0.2


@pytest.mark.slow
@needs_data
def test_anomaly_fast_reaches_94_percent(tmp_path):
    # The figure the notebook and the docs give for --fast (about a minute on 2 cores).
    result = run_cli("anomaly", "--fast", "--quiet", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert check_run_folder(tmp_path)["test"]["accuracy"] >= 0.94


def test_set_model_is_permutation_equivariant():
    torch.manual_seed(0)
    model = TransformerPredictor(input_dim=32, model_dim=64, num_classes=1, num_heads=4,
                                 num_layers=2, positional_encoding=False).eval()
    sets = torch.randn(16, 10, 32)
    perm = torch.randperm(10)
    with torch.no_grad():
        probs = model(sets).squeeze(-1).softmax(-1)
        permuted = model(sets[:, perm]).squeeze(-1).softmax(-1)
    assert (probs[:, perm] - permuted).abs().max().item() < 1e-5


def test_anomaly_missing_data_is_one_line(tmp_path):
    result = run_cli("anomaly", "--fast", "--quiet", "--data", str(tmp_path / "none"),
                 "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "Fashion-MNIST not found" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
