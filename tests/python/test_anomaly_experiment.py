"""The set-anomaly experiment on the real Fashion-MNIST (Debian's dataset-fashion-mnist)."""

import json

import pytest
import torch

from attnlab.data import FASHION_MNIST_DIR
from attnlab.models import TransformerPredictor

from cli_runner import run_cli

needs_data = pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(),
                                reason="Debian's dataset-fashion-mnist is not installed")


@needs_data
def test_anomaly_fast_reaches_94_percent(tmp_path):
    result = run_cli("anomaly", "--fast", "--quiet", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["test"]["accuracy"] >= 0.94
    # The figures are those of the best validation epoch's weights, as the tutorial's are.
    validation = [epoch["accuracy"] for epoch in summary["history"]]
    assert summary["selected_by"] == "best validation accuracy"
    assert summary["selected_epoch"] == validation.index(max(validation)) + 1
    assert summary["val"]["accuracy"] == validation[summary["selected_epoch"] - 1]
    for name in ("attention.png", "training.png", "sets.png", "mistakes.png"):
        assert (tmp_path / name).stat().st_size > 0


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
