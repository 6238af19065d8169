"""Devices: ``--device`` and ``fit(device=)``, placement of models, batches and optimizer state,
checkpoints that move between devices, and every experiment on CUDA (those tests need a GPU
and say so when they skip).

Without a GPU, what can be checked is checked on the CPU: the choice of device and its errors,
that tensors nested in batches are moved (to the ``meta`` device, which has no data), that a
checkpoint recording another device (and a CUDA random state) resumes on the CPU to the metrics
of an uninterrupted run, and that each experiment's evaluation split into shares adds up to the
whole (what several processes do)."""

import gzip
import json
import re

import numpy as np
import pytest
import torch

from attnlab import cli
from attnlab.tasks import anomaly, permutation, reverse, sparse_and, text
from attnlab.train import (TrainConfig, fit, load_checkpoint, model_device, resolve_device,
                           to_device)

from cli_runner import run_cli
from interruption import interrupt_during

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
without_cuda = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="checks the error given where no GPU is available")


# ---- choosing the device -----------------------------------------------------------------------

def test_default_device_is_cuda_when_available_else_cpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_device("cpu") == resolve_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize("device, message", [
    ("tpu", r"device must be cpu, cuda or cuda:N, got 'tpu'"),
    ("cuda:x", r"device must be cpu, cuda or cuda:N, got 'cuda:x'"),
    ("mps", r"device must be cpu, cuda or cuda:N \(attnlab's operators run on those\), got "
            r"'mps'"),
    ("cuda:-1", r"device must be cpu, cuda or cuda:N, got 'cuda:-1'"),
    (["cpu"], r"device must be cpu, cuda or cuda:N, got \['cpu'\]"),
])
def test_unknown_device_is_refused(device, message):
    with pytest.raises(ValueError, match=message):
        resolve_device(device)


@without_cuda
def test_cuda_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match=r"device 'cuda:1': CUDA is not available here .*use cpu"):
        resolve_device("cuda:1")
    task = reverse.make_task(tiny_reverse())
    with pytest.raises(ValueError, match=r"device 'cuda': CUDA is not available here"):
        fit(task, tiny_reverse().train, progress=False, device="cuda")


def cli_error(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


@without_cuda
@pytest.mark.parametrize("command", ["reverse", "anomaly", "permutation", "text", "sparse-and",
                                     "rule-and"])
def test_cli_cuda_without_a_gpu_is_one_line_exit_2(command, capsys):
    code, stderr = cli_error([command, "--device", "cuda"], capsys)
    assert code == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert re.search(r"error: argument --device: device 'cuda': CUDA is not available here",
                     stderr)


def test_cli_unknown_device_is_one_line_exit_2(capsys):
    code, stderr = cli_error(["reverse", "--device", "gpu0"], capsys)
    assert code == 2 and len(stderr.strip().splitlines()) == 1
    assert "argument --device: device must be cpu, cuda or cuda:N, got 'gpu0'" in stderr


# ---- moving tensors ----------------------------------------------------------------------------

def test_to_device_moves_every_nested_tensor():
    meta = torch.device("meta")  # a device other than the CPU, without a GPU
    batch = (torch.ones(2), [torch.zeros(3), {"mask": torch.ones(1, dtype=torch.bool)}], "name")
    moved = to_device(batch, meta)
    assert moved[0].device == meta and moved[1][0].device == meta
    assert moved[1][1]["mask"].device == meta and moved[1][1]["mask"].dtype == torch.bool
    assert moved[2] == "name" and isinstance(moved[1], list)
    same = torch.ones(2)
    assert to_device(same, torch.device("cpu")) is same  # already there: not copied


def test_model_device():
    assert model_device(torch.nn.Linear(2, 2).to("meta")) == torch.device("meta")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters


# ---- checkpoints across devices ----------------------------------------------------------------

def tiny_reverse(epochs=2, seed=5):
    return reverse.ReverseConfig(train_size=640, val_size=100, test_size=100,
                                 train=TrainConfig(epochs=epochs, seed=seed))


def test_checkpoint_recording_another_device_resumes_on_the_cpu(tmp_path, one_thread):
    config = tiny_reverse(epochs=3)
    uninterrupted = fit(reverse.make_task(config), config.train, progress=False, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        fit(interrupt_during(reverse.make_task(config), epoch=1, batch=2), config.train,
            out_dir=tmp_path, progress=False, device="cpu")
    checkpoint = tmp_path / "checkpoint.pt"
    state = load_checkpoint(checkpoint, "reverse")
    assert state["device"] == "cpu" and state["epoch"] == 1
    # As a CUDA run would have written it: its device, and the CUDA generator's state (which a
    # run on the CPU does not use).
    state["device"] = "cuda:0"
    state["rng"]["cuda"] = torch.zeros(16, dtype=torch.uint8)
    torch.save(state, checkpoint)

    resumed = fit(reverse.make_task(config), config.train, out_dir=tmp_path, progress=False,
                  device="cpu")
    assert resumed["device"] == "cpu" and resumed["world_size"] == 1
    assert resumed["history"] == uninterrupted["history"]  # bitwise
    assert resumed["test"] == uninterrupted["test"]
    assert load_checkpoint(checkpoint, "reverse")["device"] == "cpu"


def test_cli_records_the_device_and_resumes_a_checkpoint_of_another(tmp_path, monkeypatch,
                                                                   capsys, one_thread):
    monkeypatch.setattr(reverse, "fast_config", lambda seed: tiny_reverse(epochs=1, seed=seed))
    argv = ["reverse", "--fast", "--quiet", "--device", "cpu", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["device"] == "cpu" and summary["world_size"] == 1
    assert summary["lr"] == summary["config"]["train"]["lr"]  # one process: as configured
    assert "(cpu)" in capsys.readouterr().out

    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    state["device"] = "cuda:0"
    torch.save(state, tmp_path / "checkpoint.pt")
    assert cli.main(argv) == 0  # the run is complete: it loads the checkpoint and evaluates
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["test"] == summary["test"] and resumed["history"] == summary["history"]


# ---- every experiment's evaluation, in shares --------------------------------------------------

def write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big")
                                                       for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="module")
def fashion_folder(tmp_path_factory):
    """A small Fashion-MNIST-like folder: 100 training and 20 test images per class."""
    folder = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for split, n in (("train", 1000), ("t10k", 200)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return folder


def tiny_tasks(tmp_path, fashion_folder, device=None):
    """One small task of each experiment trained by fit, on ``device``; without dropout, whose
    masks come from another generator on each device."""
    corpus = text.write_demo_corpus(tmp_path / "aclImdb", reviews_per_label=30)
    configs = {
        reverse: tiny_reverse(epochs=1),
        permutation: permutation.PermutationConfig(
            batches_per_epoch=10, val_size=50, test_size=101,
            train=TrainConfig(epochs=1, lr=3e-3, warmup=5)),
        text: text.TextConfig(data=str(corpus), vocab_size=100, max_len=32, batch_size=16,
                              dropout=0.0,
                              train=TrainConfig(epochs=1, warmup=5, optimizer="adamw")),
        anomaly: anomaly.AnomalyConfig(data=str(fashion_folder), feature_epochs=1, model_dim=32,
                                       num_heads=2, num_layers=1, batch_size=16,
                                       sets_per_epoch=64, dropout=0.0, input_dropout=0.0,
                                       train=TrainConfig(epochs=1, warmup=5)),
    }
    tasks = {}
    for module, config in configs.items():
        extra = {"progress": False} if module is anomaly else {}
        tasks[module] = (module.make_task(config, device=device, **extra), config)
    return tasks


def test_evaluation_in_shares_adds_up_to_the_whole(tmp_path, fashion_folder, monkeypatch,
                                                   one_thread):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    for module, (task, config) in tiny_tasks(tmp_path, fashion_folder).items():
        fit(task, config.train, progress=False)
        for split in task.final_splits:
            whole = task.evaluate(task.model, split)
            for world_size in (2, 3):
                shares = [task.evaluate_sums(task.model, split, rank, world_size)
                          for rank in range(world_size)]
                for name, value in whole.items():
                    numerator = sum(share[name][0] for share in shares)
                    denominator = sum(share[name][1] for share in shares)
                    assert numerator / denominator == pytest.approx(value, rel=1e-6, abs=1e-9), \
                        (module.__name__, split, name)
        # A share can be empty (more processes than rows); it counts nothing.
        empty = task.evaluate_sums(task.model, "val", 10_000, 10_001)
        assert all(denominator == 0 for _, denominator in empty.values()), module.__name__


# ---- on a GPU ----------------------------------------------------------------------------------

@needs_cuda
def test_every_fit_experiment_trains_on_cuda(tmp_path, fashion_folder, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    cpu = tiny_tasks(tmp_path / "cpu", fashion_folder, device="cpu")
    for module, (task, config) in tiny_tasks(tmp_path / "cuda", fashion_folder,
                                             device="cuda").items():
        assert model_device(task.model).type == "cuda"  # make_task placed it
        result = fit(task, config.train, progress=False)
        assert result["device"].startswith("cuda") and model_device(task.model).type == "cuda"
        for split in task.final_splits:
            assert 0 <= result[split]["accuracy"] <= 1
        maps, tokens = module.attention_example(task)
        assert all(m.device.type == "cpu" and torch.isfinite(m).all() for m in maps)
        # Same data and initial weights as on the CPU: the first steps agree to rounding (the
        # anomaly task's features come from a CNN trained on each device: less closely).
        cpu_task, cpu_config = cpu[module]
        on_cpu = fit(cpu_task, cpu_config.train, progress=False)
        assert result["history"][0]["train_loss"] == pytest.approx(
            on_cpu["history"][0]["train_loss"], rel=2e-2 if module is anomaly else 2e-3), \
            module.__name__
    assert any("_cuda" in p.name for p in (tmp_path / "cache").iterdir())  # GPU features cache


@needs_cuda
def test_sparse_and_and_rule_and_train_on_cuda():
    config = sparse_and.fast_config(seeds=1)
    run = sparse_and.run_one("SAT", 2, 0, config, device="cuda")
    assert model_device(run["model"]).type == "cuda" and 0 <= run["val"]["accuracy"] <= 1
    cpu = sparse_and.run_one("SAT", 2, 0, config, device="cpu")
    assert run["train_losses"][0] == pytest.approx(cpu["train_losses"][0], rel=1e-4)
    attention = sparse_and.last_token_attention(run["model"], run["val_data"][0])
    assert attention.device.type == "cpu"
    rule = sparse_and.run_rule_task(sparse_and.RuleAndConfig(epochs=50), device="cuda")
    assert rule["edges"].device.type == "cpu" and torch.isfinite(rule["edges"]).all()


@needs_cuda
@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_checkpoint_written_on_one_device_resumes_on_the_other(tmp_path, first, then):
    config = tiny_reverse(epochs=3)
    with pytest.raises(KeyboardInterrupt):
        fit(interrupt_during(reverse.make_task(config), epoch=1, batch=2), config.train,
            out_dir=tmp_path, progress=False, device=first)
    written = load_checkpoint(tmp_path / "checkpoint.pt", "reverse")
    assert written["device"].startswith(first) and written["epoch"] == 1
    task = reverse.make_task(config)
    resumed = fit(task, config.train, out_dir=tmp_path, progress=False, device=then)
    assert resumed["device"].startswith(then) and model_device(task.model).type == then
    assert resumed["history"][0] == written["history"][0] and len(resumed["history"]) == 3
    # The optimizer's state moved with the model: the last checkpoint holds it on `then`.
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)  # no map_location
    moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
    assert moments and all(m.device.type == then for m in moments)
    uninterrupted = fit(reverse.make_task(config), config.train, progress=False, device=then)
    assert resumed["test"]["accuracy"] == pytest.approx(uninterrupted["test"]["accuracy"],
                                                        abs=0.02)


@needs_cuda
def test_cli_reverse_fast_on_cuda(tmp_path):
    result = run_cli("reverse", "--fast", "--quiet", "--device", "cuda", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["device"].startswith("cuda") and summary["test"]["accuracy"] >= 0.99
