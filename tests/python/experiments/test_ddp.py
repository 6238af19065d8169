"""Training in several processes with PyTorch's DistributedDataParallel, on the CPU with gloo:
two processes started by torchrun (``python -m torch.distributed.run``), one thread each.

Two processes taking batches r, r + 2, ... of the epoch train as one process does on batches
twice as large (the learning rate doubled, the warm-up halved); their weights stay identical;
a run killed mid-epoch resumes to the metrics of an uninterrupted one; the command line trains
under torchrun (to the accuracy one process reaches: a slow test). The same for Lightning's
``Trainer(strategy="ddp", devices=2)`` with attnlab's Lightning adapter."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnlab import cli
from attnlab.tasks import reverse
from attnlab.train import fit, load_checkpoint, rank_seed

sys.path.insert(0, str(Path(__file__).parent))
from ddp_worker import small_config  # noqa: E402

WORKER = Path(__file__).parent / "ddp_worker.py"
LIGHTNING_WORKER = Path(__file__).parent / "lightning_ddp_worker.py"
# PYTHONFAULTHANDLER: a worker that dies of a signal prints where (its threads' Python stacks).
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def torchrun(*args, **popen):
    """``python -m torch.distributed.run --standalone --nproc-per-node 2 ARGS`` (a free port
    each time, so runs never meet)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", *map(str, args)]
    if popen:
        return subprocess.Popen(command, env=ONE_THREAD, **popen)
    return subprocess.run(command, env=ONE_THREAD, capture_output=True, text=True, timeout=300)


def ranks(out):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """An uninterrupted two-process run of ddp_worker.small_config(), with its checkpoint."""
    out = tmp_path_factory.mktemp("ddp")
    run = torchrun(WORKER, "train", out)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_both_processes_hold_identical_weights_and_metrics(two_process_run):
    first, second = ranks(two_process_run)
    assert first["world_size"] == second["world_size"] == 2 and first["device"] == "cpu"
    assert first["steps_per_epoch"] == 20 and first["lr"] == 1e-3 and first["warmup_steps"] == 5
    assert first["fused"]  # the fused encoder operator's gradients went through DDP
    weights = [torch.load(two_process_run / f"rank{r}.pt") for r in (0, 1)]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name  # no process diverged
    assert first["history"] == second["history"] and first["test"] == second["test"]
    # Dropout and other draws: the run's seed in process 0, one derived from it in process 1.
    assert first["seed"] == 7 and second["seed"] == rank_seed(7, 1) != 7
    state = load_checkpoint(two_process_run / "checkpoint.pt", "reverse")
    assert state["world_size"] == 2 and state["epoch"] == 3 and len(state["rank_rng"]) == 2


def test_two_processes_train_as_one_process_on_double_batches(two_process_run):
    # One process on batches of 128 = the two processes' batches of 64 side by side, with the
    # learning rate and warm-up the two processes use: the same training up to rounding.
    config = small_config(batch_size=128, lr=1e-3, warmup=5)
    task = reverse.make_task(config)
    one = fit(task, config.train, progress=False)
    two = ranks(two_process_run)[0]
    weights = torch.load(two_process_run / "rank0.pt")
    for name, tensor in task.model.state_dict().items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-3, atol=1e-4, msg=name)
    for mine, theirs in zip(two["history"], one["history"]):
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-4)
        # evaluated in shares by the two processes and summed: every sequence counted once
        assert mine["accuracy"] == pytest.approx(theirs["accuracy"], abs=2 / (300 * 16))
    assert two["test"]["accuracy"] == pytest.approx(one["test"]["accuracy"], abs=2 / (301 * 16))


def test_gradients_are_the_mean_over_processes(two_process_run):
    grads = [torch.load(two_process_run / f"rank{r}_gradients.pt") for r in (0, 1)]
    for name, own0 in grads[0]["own"].items():
        mean = (own0.double() + grads[1]["own"][name].double()) / 2  # reference, in float64
        assert not torch.equal(own0, grads[1]["own"][name]), name  # the batches differ
        for rank in (0, 1):
            torch.testing.assert_close(grads[rank]["synced"][name].double(), mean, rtol=1e-5,
                                       atol=1e-7, msg=name)


def child_pids(pid):
    """The processes whose parent is ``pid`` (torchrun's workers run in sessions of their
    own, so killing torchrun's process group would miss them)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.name))
    return children


def test_run_killed_mid_epoch_resumes_to_the_uninterrupted_metrics(tmp_path, two_process_run):
    killed = tmp_path / "killed"
    run = torchrun(WORKER, "slow", killed, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    checkpoint = killed / "checkpoint.pt"
    deadline = time.monotonic() + 240
    while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = child_pids(run.pid)
    for pid in [run.pid, *workers]:  # the whole job at once, as a lost machine would
        os.kill(pid, signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL and len(workers) == 2
    # The second epoch has just begun: 40 batches of 50 ms (3 only on a crowded machine).
    assert load_checkpoint(checkpoint, "reverse")["epoch"] in (1, 2)
    assert not (killed / "rank0.json").exists()  # it did not finish

    resumed = torchrun(WORKER, "train", killed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for mine, uninterrupted in zip(ranks(killed), ranks(two_process_run)):
        assert mine["history"] == uninterrupted["history"]  # bitwise
        assert mine["test"] == uninterrupted["test"]


def test_checkpoint_of_two_processes_is_refused_by_one(two_process_run):
    from attnlab.train import CheckpointError
    config = small_config()
    with pytest.raises(CheckpointError, match=r"written by a run of 2 process\(es\), this run "
                       r"has 1.*--nproc-per-node 2"):
        fit(reverse.make_task(config), config.train, out_dir=two_process_run, progress=False)


def test_rank_seeds_are_the_runs_for_process_0_and_distinct_for_the_others():
    assert rank_seed(7, 0) == 7 and rank_seed(7, 1) == rank_seed(7, 1)  # repeatable
    seeds = {rank_seed(seed, rank) for seed in range(20) for rank in range(1, 9)}
    assert len(seeds) == 160 and not seeds & set(range(20))
    assert all(0 <= seed < 2**63 for seed in seeds)


@pytest.mark.parametrize("command", ["sparse-and", "rule-and"])
def test_full_batch_experiments_refuse_several_processes(command, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun sets it
    assert cli.main([command, "--fast", "--device", "cpu"]) == 1
    stderr = capsys.readouterr().err.strip()
    assert stderr == (f"attnlab {command}: error: {command} trains full-batch models in one "
                      f"process; run it without torchrun")


def test_command_line_trains_under_torchrun(tmp_path):
    # The command line on the small task: its steps, reports, files and checkpoint under
    # torchrun; the accuracy of the --fast recipe is the slow test's below.
    run = torchrun(WORKER, "cli", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["world_size"] == 2 and summary["device"] == "cpu"
    assert len(summary["history"]) == 3 and summary["steps_per_epoch"] == 20
    losses = [epoch["train_loss"] for epoch in summary["history"]]
    assert losses[-1] < losses[0], losses
    assert run.stdout.count("test accuracy") == 1  # process 0 alone reports
    for name in ("attention.png", "training.png", "checkpoint.pt"):
        assert (tmp_path / name).stat().st_size > 0
    assert load_checkpoint(tmp_path / "checkpoint.pt", "reverse")["world_size"] == 2


@pytest.mark.slow
def test_command_line_under_torchrun_reaches_the_one_process_target(tmp_path):
    # reverse --fast reaches 99 % in one process (test_experiments); two processes must too.
    run = torchrun("-m", "attnlab", "reverse", "--fast", "--quiet", "--out", tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["world_size"] == 2 and summary["device"] == "cpu"
    assert summary["test"]["accuracy"] >= 0.99
    assert len(summary["history"]) == 6 and summary["steps_per_epoch"] == 125
    assert run.stdout.count("test accuracy") == 1  # process 0 alone reports
    for name in ("attention.png", "training.png", "checkpoint.pt"):
        assert (tmp_path / name).stat().st_size > 0
    assert load_checkpoint(tmp_path / "checkpoint.pt", "reverse")["world_size"] == 2


@pytest.mark.long  # three Lightning runs of two processes: about 20 s on 2 cores
def test_lightning_ddp_killed_and_resumed_trains_as_attnlab_does(tmp_path, two_process_run):
    pytest.importorskip("lightning", reason="Lightning is optional (pip install lightning)")
    # Lightning starts the second process itself, in the first one's process group.
    run = subprocess.Popen([sys.executable, LIGHTNING_WORKER, "stall", tmp_path], env=ONE_THREAD,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    deadline = time.monotonic() + 240
    while (not (tmp_path / "stalled").exists() and run.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.05)
    assert run.poll() is None, run.stderr.read()[-3000:]  # stalled mid-epoch, not finished
    second = child_pids(run.pid)
    os.killpg(run.pid, signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL and len(second) == 1
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 0  # 1 epoch done

    resumed = subprocess.run([sys.executable, LIGHTNING_WORKER, "resume", tmp_path],
                             env=ONE_THREAD, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, other = ranks(tmp_path)
    assert first == other and first["world_size"] == 2
    assert first["global_step"] == 3 * 20 and first["lr"] == 1e-3  # 20 steps an epoch, lr × 2
    weights = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    # attnlab's own loop under torchrun: the same batches, steps, schedule and clipping.
    reference = torch.load(two_process_run / "rank0.pt")
    for name in reference:
        assert torch.equal(weights[0][name], weights[1][name]), name  # no process diverged
        torch.testing.assert_close(weights[0][name], reference[name], rtol=1e-5, atol=1e-6,
                                   msg=name)
    uninterrupted = ranks(two_process_run)[0]
    assert first["test"] == uninterrupted["test"]
    assert first["val"]["accuracy"] == uninterrupted["history"][-1]["accuracy"]
