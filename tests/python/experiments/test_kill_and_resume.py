"""Training runs in other processes: the same seed gives bitwise the same run, a run killed
(SIGKILL) mid-epoch resumes from its last checkpoint to the metrics of an uninterrupted run, and
a kill in the middle of writing a checkpoint leaves the previous one intact."""

import json
import signal
import subprocess
import sys
import time

import torch

from attnlab.tasks import reverse
from attnlab.train import TrainConfig, fit, load_checkpoint


def small_config():
    return reverse.ReverseConfig(train_size=1280, val_size=200, test_size=200,
                                 train=TrainConfig(epochs=3, seed=7))


# Trains small_config() in a child process, each batch after the first epoch slowed by 50 ms
# (which changes no result) so that a kill sent once the first checkpoint exists lands mid-epoch.
SLOW_TRAINING = """
import sys, time
from attnlab.tasks import reverse
from attnlab.train import TrainConfig, fit
config = reverse.ReverseConfig(train_size=1280, val_size=200, test_size=200,
                               train=TrainConfig(epochs=3, seed=7))
task = reverse.make_task(config)
batches = task.train_batches

def slowed(epoch, generator):
    for batch in batches(epoch, generator):
        if epoch > 0:
            time.sleep(0.05)
        yield batch

task.train_batches = slowed
fit(task, config.train, out_dir=sys.argv[1], progress=False)
"""


def test_run_killed_mid_epoch_resumes_to_the_uninterrupted_metrics(tmp_path):
    run = subprocess.Popen([sys.executable, "-c", SLOW_TRAINING, str(tmp_path)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    checkpoint = tmp_path / "checkpoint.pt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGKILL)  # the second epoch has just begun: 10 batches of 50 ms
    assert run.wait() == -signal.SIGKILL  # killed, not finished
    assert load_checkpoint(checkpoint, "reverse")["epoch"] in (1, 2)  # 2 only on a crowded machine

    resumed = fit(reverse.make_task(small_config()), small_config().train, out_dir=tmp_path,
                  progress=False)
    uninterrupted = fit(reverse.make_task(small_config()), small_config().train, progress=False)
    assert resumed["history"] == uninterrupted["history"]  # bitwise: losses and accuracies
    assert resumed["test"] == uninterrupted["test"]


# Runs small_config() in a child process whose torch.save writes half of the second checkpoint
# and then kills the process, as a SIGKILL or power cut in the middle of the write would.
KILLED_WHILE_SAVING = """
import io, os, signal, sys
import torch
from attnlab.tasks import reverse
from attnlab.train import TrainConfig, fit

real_save = torch.save

def save_half_then_die(obj, f):
    if isinstance(obj, dict) and obj.get("epoch") == 2:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[:len(buffer.getvalue()) // 2])
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    real_save(obj, f)

torch.save = save_half_then_die
config = reverse.ReverseConfig(train_size=1280, val_size=200, test_size=200,
                               train=TrainConfig(epochs=3, seed=7))
fit(reverse.make_task(config), config.train, out_dir=sys.argv[1], progress=False)
"""


def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    child = subprocess.run([sys.executable, "-c", KILLED_WHILE_SAVING, str(tmp_path)],
                           capture_output=True, text=True)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert load_checkpoint(tmp_path / "checkpoint.pt", "reverse")["epoch"] == 1
    torn = tmp_path / "checkpoint.pt.tmp"  # the half-written file, never renamed
    assert 0 < torn.stat().st_size

    resumed = fit(reverse.make_task(small_config()), small_config().train, out_dir=tmp_path,
                  progress=False)
    uninterrupted = fit(reverse.make_task(small_config()), small_config().train, progress=False)
    assert resumed["history"] == uninterrupted["history"]  # bitwise
    assert resumed["test"] == uninterrupted["test"]
    assert not torn.exists() and load_checkpoint(tmp_path / "checkpoint.pt", "reverse")["epoch"] == 3


# Trains small_config() and prints a digest of everything it produced.
TRAIN_AND_DIGEST = """
import hashlib, json, torch
from attnlab.tasks import reverse
from attnlab.train import TrainConfig, fit
config = reverse.ReverseConfig(train_size=1280, val_size=200, test_size=200,
                               train=TrainConfig(epochs=2, seed=3))
task = reverse.make_task(config)
result = fit(task, config.train, progress=False)
digest = hashlib.sha256()
for name, tensor in sorted(task.model.state_dict().items()):
    digest.update(name.encode() + tensor.numpy().tobytes())
print(json.dumps({"weights": digest.hexdigest(), "history": result["history"],
                  "test": result["test"]}))
"""


def test_same_seed_gives_bitwise_identical_runs_in_separate_processes():
    runs = [subprocess.run([sys.executable, "-c", TRAIN_AND_DIGEST], capture_output=True,
                           text=True) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    first, second = (json.loads(run.stdout) for run in runs)
    assert first == second  # final weights, every epoch's loss and accuracy, test accuracy
    assert len(first["history"]) == 2 and torch.tensor(first["test"]["accuracy"]).isfinite()
