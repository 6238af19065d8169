"""The tutorial's set-anomaly setting, CIFAR-100 through a ResNet-34, on a small CIFAR-format
folder and a randomly initialised ResNet-34, both made here."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

torchvision = pytest.importorskip("torchvision", reason="the CIFAR-100 path needs torchvision")

from attnlab.data import DataError, load_cifar100  # noqa: E402
from attnlab.features import cifar_resnet_features  # noqa: E402
from attnlab.tasks import anomaly  # noqa: E402
from attnlab.tasks.anomaly_sets import SET_SIZE  # noqa: E402

CLASSES = [3, 17, 42, 99]  # a few of the 100 fine labels
TRAIN_PER_CLASS, TEST_PER_CLASS = 90, 10  # 10 % of 90 = 9 validation images: one full set


def write_pickle(path, content):
    with open(path, "wb") as f:
        pickle.dump(content, f, protocol=2)  # the protocol of the real files


def make_cifar_folder(root):
    """train/test/meta in the cifar-100-python layout; each class a tinted noise pattern."""
    rng = np.random.default_rng(0)
    root.mkdir()
    write_pickle(root / "meta", {"fine_label_names": [f"class{i}" for i in range(100)],
                                 "coarse_label_names": [f"super{i}" for i in range(20)]})
    for split, per_class in (("train", TRAIN_PER_CLASS), ("test", TEST_PER_CLASS)):
        labels = np.repeat(CLASSES, per_class)
        rng.shuffle(labels)
        tint = (labels[:, None] * np.array([37, 91, 53])) % 256  # [N, 3]
        images = rng.integers(0, 64, (len(labels), 3, 32, 32)) + tint[:, :, None, None] * 0.75
        write_pickle(root / split, {"data": images.astype(np.uint8).reshape(len(labels), -1),
                                    "fine_labels": labels.tolist(),
                                    "coarse_labels": (labels // 5).tolist()})
    return root


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    """(data folder, ResNet-34 weights file, cache folder)."""
    root = tmp_path_factory.mktemp("cifar")
    torch.manual_seed(0)
    weights = root / "resnet34-random.pth"
    torch.save(torchvision.models.resnet34(weights=None).state_dict(), weights)
    return make_cifar_folder(root / "cifar-100-python"), weights, root / "cache"


def test_loader_reads_the_python_layout(cifar):
    data = load_cifar100(cifar[0])
    images, labels = data["train"]
    assert images.shape == (len(CLASSES) * TRAIN_PER_CLASS, 3, 32, 32) and images.dtype == torch.uint8
    assert sorted(labels.unique().tolist()) == CLASSES
    assert data["test"][0].shape[0] == len(CLASSES) * TEST_PER_CLASS
    assert len(data["classes"]) == 100 and data["classes"][42] == "class42"


def test_features_are_512_wide_and_cached(cifar):
    folder, weights, cache = cifar
    first = cifar_resnet_features(folder, weights, image_size=64, cache_dir=cache, progress=False)
    assert first["train"][0].shape == (len(CLASSES) * TRAIN_PER_CLASS, 512)
    assert first["test"][0].shape == (len(CLASSES) * TEST_PER_CLASS, 512)
    assert torch.isfinite(first["train"][0]).all()
    # The features are the network's: recompute one batch by hand.
    net = torchvision.models.resnet34(weights=None)
    net.load_state_dict(torch.load(weights))
    net.fc = torch.nn.Identity()
    images = load_cifar100(folder)["test"][0][:4].float() / 255
    x = torch.nn.functional.interpolate(images, size=64, mode="bilinear")
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = net.eval()((x - mean) / std)
    torch.testing.assert_close(first["test"][0][:4], expected, rtol=1e-4, atol=1e-5)

    assert len(list(cache.iterdir())) == 1
    second = cifar_resnet_features(folder, weights, image_size=64, cache_dir=cache, progress=False)
    assert torch.equal(first["train"][0], second["train"][0])
    assert len(list(cache.iterdir())) == 1  # served from the cache


def test_cli_trains_on_cifar_and_draws_colour_sets(cifar, tmp_path):
    folder, weights, cache = cifar
    result = subprocess.run(
        [sys.executable, "-m", "attnlab", "anomaly", "--fast", "--quiet", "--epochs", "1",
         "--dataset", "cifar100", "--data", str(folder), "--weights", str(weights),
         "--image-size", "64", "--out", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "ATTNLAB_CACHE": str(cache)})
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["config"]["dataset"] == "cifar100"
    assert set(summary) >= {"train", "val", "test"}
    for name in ("attention.png", "training.png", "sets.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert "train accuracy" in result.stdout


def test_sets_hold_nine_of_one_class_and_one_other(cifar, monkeypatch):
    folder, weights, cache = cifar
    monkeypatch.setenv("ATTNLAB_CACHE", str(cache))
    config = anomaly.AnomalyConfig(dataset="cifar100", data=str(folder), weights=str(weights),
                                   image_size=64)
    task = anomaly.make_task(config, progress=False)
    sets = task.examples["test_sets"]
    labels = task.examples["test_labels"][sets]  # [S, 10]
    assert sets.shape == (len(CLASSES) * TEST_PER_CLASS, SET_SIZE)
    assert (labels[:, :-1] == labels[:, :1]).all()
    assert (labels[:, -1] != labels[:, 0]).all()
    assert task.model.input_net[1].in_features == 512


def test_bad_cifar_inputs(cifar, tmp_path):
    folder, weights, cache = cifar
    with pytest.raises(DataError, match="not a folder"):
        load_cifar100(tmp_path / "none")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "meta").write_bytes((folder / "meta").read_bytes())
    (broken / "train").write_bytes((folder / "train").read_bytes()[:1000])  # truncated
    with pytest.raises(DataError, match="not a readable CIFAR-100 pickle"):
        load_cifar100(broken)
    (broken / "train").write_bytes(pickle.dumps(print))  # a pickle naming a function
    with pytest.raises(DataError, match="refusing to load builtins.print"):
        load_cifar100(broken)
    write_pickle(broken / "train", {"data": np.zeros((2, 100), np.uint8), "fine_labels": [0, 1]})
    with pytest.raises(DataError, match=r"uint8 array \[N, 3072\]"):
        load_cifar100(broken)
    write_pickle(broken / "train", {"data": np.zeros((2, 3072), np.uint8), "fine_labels": [0, 100]})
    with pytest.raises(DataError, match=r"labels must lie in \[0, 100\)"):
        load_cifar100(broken)
    (broken / "train").unlink()
    with pytest.raises(DataError, match="does not exist"):
        load_cifar100(broken)

    with pytest.raises(DataError, match="ResNet-34 weights not found"):
        cifar_resnet_features(folder, tmp_path / "missing.pth", cache_dir=tmp_path / "c")
    resnet18 = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), resnet18)
    with pytest.raises(DataError, match="is not a ResNet-34 state_dict"):
        cifar_resnet_features(folder, resnet18, cache_dir=tmp_path / "c", progress=False)
    with pytest.raises(ValueError, match="dataset cifar100 needs data"):
        anomaly.AnomalyConfig(dataset="cifar100")
    with pytest.raises(ValueError, match="dataset must be one of"):
        anomaly.AnomalyConfig(dataset="cifar10")
