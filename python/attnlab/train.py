"""One training loop for every experiment: progress bar, cosine warm-up schedule, gradient
clipping, evaluation, a repeatable seed, and a checkpoint at the end of every epoch from which
an interrupted run resumes.

Devices: ``fit`` trains on the CPU or a CUDA device (``device=``); the model, each batch and the
optimizer's state live there, while data, shuffling and checkpoints stay on the CPU, so a run
gives on the CPU exactly what it gave before devices existed, and a checkpoint written on one
device resumes on another.

Several processes: under ``torchrun --nproc-per-node N`` (``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` in the environment) ``fit`` trains the model as a
``torch.nn.parallel.DistributedDataParallel`` (gloo on the CPU, NCCL on CUDA, one device per
local rank). Every process draws the same epoch of batches from the run's seed and takes its
share: process r takes batches r, r + N, r + 2N, ... of the epoch, so one optimizer step covers
N consecutive batches of the one-process sequence (a global batch N times as large, gradients
averaged) and an epoch has ``batches_per_epoch // N`` steps (up to N − 1 trailing batches are
left out). With N times fewer, N times larger steps, the learning rate is multiplied by N (the
linear scaling rule) and the warm-up divided by N (rounded up: it spans the same number of
samples); the cosine decay spans the run's actual steps. Dropout and other random draws use one
seed per process derived from the run's seed; metrics are summed over the processes; only
process 0 writes the checkpoint, and a resumed run hands it to every process."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch import nn
from tqdm import tqdm  # the text bar: tqdm.auto warns in kernels without ipywidgets

from .nn import CosineWarmupScheduler

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
SCHEDULES = ("cosine", "constant")


@dataclass
class TrainConfig:
    """How ``fit`` trains: epochs, the optimizer's learning rate, the schedule ("cosine": linear
    warm-up over ``warmup`` steps, then a cosine decay to 0 at the last step; "constant": the
    learning rate throughout, ``warmup`` unused), gradient-norm clipping (None: none), the seed
    and the optimizer."""

    epochs: int = 10
    lr: float = 5e-4
    warmup: int = 50
    grad_clip: float | None = 5.0
    seed: int = 0
    optimizer: str = "adam"  # or "adamw" (torch's default weight decay, 0.01)
    schedule: str = "cosine"

    def __post_init__(self):
        for name in ("epochs", "warmup", "seed"):
            if not isinstance(getattr(self, name), int):
                raise TypeError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        # `not x > 0` also refuses NaN, which every comparison lets through.
        if not (math.isfinite(self.lr) and self.lr > 0) or self.warmup < 1 \
                or (self.grad_clip is not None and not self.grad_clip > 0):
            raise ValueError(f"lr (finite), warmup and grad_clip must be positive, got "
                             f"{self.lr}, {self.warmup}, {self.grad_clip}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                             f"{self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got "
                             f"{self.schedule!r}")


@dataclass
class Task:
    """What an experiment gives the loop: a model, its data, its loss and metric.

    ``train_batches(epoch, generator)`` yields (inputs, targets) for one epoch, on the CPU (the
    loop moves them to the model's device);
    ``evaluate(model, split)`` returns a metric dict for each split in ``final_splits`` (always
    "val" and "test"; "train" where the experiment reports it), running the model on its own
    device; ``accuracy(outputs, targets)``,
    when given, is the fraction of a training batch predicted right, shown while training;
    ``examples`` holds inputs the experiment's plots use.

    ``evaluate_sums(model, split, rank, world_size)``, when given, evaluates only the rows
    ``rank::world_size`` of the split and returns each metric as (numerator, denominator), so
    that processes training together can each evaluate a share and add them up; without it
    every process evaluates the whole split.

    ``select_best``, when given, names a validation metric (a key of what ``evaluate`` returns,
    larger is better): the final splits are then measured on the weights of the epoch with its
    best value (the first such epoch on a tie), which ``fit`` reloads at the end, as Lightning's
    ``ModelCheckpoint(monitor=..., mode="max")`` followed by loading the best checkpoint does.
    Without it they are measured on the last epoch's weights."""

    name: str
    model: nn.Module
    train_batches: Callable[[int, torch.Generator], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    batches_per_epoch: int
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module, str], dict]
    examples: dict = field(default_factory=dict)
    accuracy: Callable[[torch.Tensor, torch.Tensor], float] | None = None
    final_splits: tuple[str, ...] = ("val", "test")
    evaluate_sums: Callable[[nn.Module, str, int, int], dict[str, tuple[float, float]]] | None \
        = None
    select_best: str | None = None


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not belong to this run."""


# What fit() writes and reads back on resuming.
CHECKPOINT_KEYS = {"task", "epoch", "model", "optimizer", "scheduler", "generator", "rng",
                   "history", "seconds", "train_config"}


def seed_everything(seed: int) -> None:
    """Seeds Python's, NumPy's and torch's global generators (torch's on every device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """The seed of process ``rank`` in a run seeded ``seed``: the run's seed itself for process
    0 (so one process trains as before), a number derived from (seed, rank) for the others."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed % 2**63, rank]).generate_state(1, np.uint64)[0]
               % 2**63)


def _rng_state(device: torch.device | None = None) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": np.random.get_state()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device | None = None) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    # The CUDA generator's state only where this run is on CUDA and the saved one was too; a
    # run moved between devices goes on with the seeded generator of its new device.
    if device is not None and device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


# ---- devices and processes -------------------------------------------------------------------

DEVICE_TYPES = ("cpu", "cuda")


def _local_rank() -> int | None:
    value = os.environ.get("LOCAL_RANK")
    return int(value) if value is not None and value.isdigit() else None


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to train on: ``None`` gives CUDA when a GPU is available, else the CPU;
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (a string or a ``torch.device``) are checked.
    Under torchrun, ``"cuda"`` means the GPU of the process's local rank (``LOCAL_RANK``).
    Raises ValueError naming the device for anything else, or for CUDA without a GPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
    if parsed.type not in DEVICE_TYPES:
        raise ValueError(f"device must be cpu, cuda or cuda:N (attnlab's operators run on "
                         f"those), got {str(device)!r}")
    if parsed.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r}: CUDA is not available here (torch "
                         f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}, GPUs "
                         f"found: 0); use cpu")
    index = parsed.index
    if index is None:
        local = _local_rank()
        index = local if local is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ValueError(f"device {str(device)!r}: there is no CUDA device {index}; this machine "
                         f"has {torch.cuda.device_count()}")
    return torch.device("cuda", index)


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter (or buffer); the CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def to_device(data: Any, device: torch.device) -> Any:
    """``data`` with every tensor in it (also inside tuples, lists and dicts) moved to
    ``device``; tensors already there are returned as they are."""
    if isinstance(data, torch.Tensor):  # asynchronous only host to GPU, where that is safe
        return data.to(device, non_blocking=device.type == "cuda")
    if isinstance(data, (tuple, list)):
        return type(data)(to_device(item, device) for item in data)
    if isinstance(data, dict):
        return {key: to_device(value, device) for key, value in data.items()}
    return data


def world() -> tuple[int, int]:
    """(rank, world size) of this process: from the initialised process group, else from
    torchrun's ``RANK`` and ``WORLD_SIZE``, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


# How long process_group's exit leaves the GIL free for gloo's worker threads (see there).
_GLOO_DRAIN_SECONDS = 0.05


@contextlib.contextmanager
def process_group(device: str | torch.device | None = None) -> Iterator[tuple[int, int]]:
    """Yields (rank, world size). Under torchrun (``WORLD_SIZE`` > 1) with no process group
    yet, initialises one (NCCL for a CUDA ``device``, gloo for the CPU; ``device`` as
    ``resolve_device`` takes it) and destroys it on leaving; an existing group is used as it
    is; a single process needs none."""
    dist = torch.distributed
    device = resolve_device(device)
    rank, size = world()
    if size > 1 and not dist.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch has no torch.distributed")
    if size == 1 or dist.is_initialized():
        yield rank, size
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    try:
        yield dist.get_rank(), dist.get_world_size()
        # Every process is done before the group goes. Once DistributedDataParallel has used
        # a gloo group, destroy_process_group does not join gloo's worker threads (torch 2.15:
        # two pt_gloo_runloop threads still run after it and a gc.collect()), so they outlive
        # the interpreter. A worker that drops a Python-owned tensor then needs the GIL, and a
        # thread that asks for it while Python 3.11 shuts down is ended inside a C++
        # destructor: "terminate called without an active exception", SIGABRT (the known
        # mechanism, pytorch/pytorch#179291). A two-process test run aborted that way once in
        # CI; it did not recur in 40 runs on a 2-core machine, nor when provoked (an async
        # all_reduce of 16-256 MB dropped just before exit), so what released what is not
        # known. As a precaution the barrier's wait and then a pause with the GIL free give
        # pending releases the time to finish. Not after an exception: the other processes
        # may never arrive.
        dist.barrier()
        if dist.get_backend() == "gloo":
            time.sleep(_GLOO_DRAIN_SECONDS)
    finally:
        dist.destroy_process_group()


def _collective_device(device: torch.device) -> torch.device:
    """Where tensors for collectives live: the CUDA device under NCCL, else the CPU."""
    backend = torch.distributed.get_backend()
    return device if backend == "nccl" else torch.device("cpu")


def _from_rank_zero(make: Callable[[], Any], device: torch.device) -> Any:
    """``make()`` run by process 0, its result (or its exception) given to every process."""
    rank, size = world()
    if size == 1:
        return make()
    box: list = [None]
    if rank == 0:
        try:
            box = [("value", make())]
        except Exception as error:  # every process raises it, none waits forever
            box = [("error", error)]
    torch.distributed.broadcast_object_list(box, src=0, device=_collective_device(device))
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def leaders_first(make: Callable[[], Any]) -> Any:
    """``make()`` on every process, process 0 first, then the first process of each machine
    (``LOCAL_RANK`` 0), then the rest, with barriers between: what the first writes to a cache
    (features) the others read, instead of all computing it at once. This needs the process
    group (the command line opens it before building the task; in your own script wrap the
    task's construction and ``fit`` in ``with process_group(device):``); without one, or in
    one process, it is just ``make()``."""
    rank, size = world()
    if size == 1 or not torch.distributed.is_initialized():
        return make()
    local = _local_rank() or 0
    stages = (rank == 0, rank != 0 and local == 0, rank != 0 and local != 0)
    result = failure = None
    for mine in stages:
        if mine:
            try:
                result = make()
            except Exception as error:  # raised after the barriers: no process waits forever
                failure = error
        torch.distributed.barrier()
    if failure is not None:
        raise failure
    return result


def _shared_batches(batches: Iterable, rank: int, size: int, steps: int) -> Iterator:
    """Process ``rank``'s share of an epoch: batches rank, rank + size, ... of the first
    ``steps * size``. Every process draws the whole epoch, so the data generator stays the same
    in all of them (and as in one process). One process takes every batch."""
    if size == 1:
        yield from batches
        return
    for index, batch in enumerate(batches):
        if index < steps * size and index % size == rank:
            yield batch


def _all_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum over the processes, in float64."""
    tensor = torch.tensor(values, dtype=torch.float64, device=_collective_device(device))
    torch.distributed.all_reduce(tensor)
    return tensor.tolist()


def _evaluate(task: Task, model: nn.Module, split: str, device: torch.device) -> dict:
    """``task.evaluate`` in one process; under several, each evaluates its share of the rows
    (``task.evaluate_sums``) and the numerators and denominators are summed."""
    rank, size = world()
    if size == 1:
        return task.evaluate(model, split)
    if task.evaluate_sums is None:  # every process evaluates it all; the results agree
        metrics = task.evaluate(model, split)
        names = sorted(metrics)
        totals = _all_sum([float(metrics[name]) for name in names], device)
        return {name: total / size for name, total in zip(names, totals)}
    sums = task.evaluate_sums(model, split, rank, size)
    names = sorted(sums)
    totals = _all_sum([float(sums[name][i]) for name in names for i in (0, 1)], device)
    return {name: totals[2 * i] / totals[2 * i + 1] for i, name in enumerate(names)}


def save_atomically(obj, path: Path) -> None:
    """torch.save to a temporary file beside ``path``, then rename: a crash leaves the previous
    checkpoint intact, never a half-written one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename makes it the checkpoint
    os.replace(tmp, path)


def load_checkpoint(path: Path, task_name: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # any unreadable file: truncated, foreign, not a checkpoint
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
    if not isinstance(state, dict) or state.get("task") != task_name:
        written_for = (f" (it was written by the {state['task']!r} one; use another --out "
                       f"folder)" if isinstance(state, dict) and isinstance(state.get("task"), str)
                       else "")
        raise CheckpointError(f"{path} is not a checkpoint of the {task_name!r} "
                              f"experiment{written_for}")
    missing = sorted(CHECKPOINT_KEYS - state.keys())
    if missing:
        raise CheckpointError(f"{path} is an incomplete checkpoint: it lacks {', '.join(missing)}")
    return state


def _read_resume_state(checkpoint: Path, task: Task, config: TrainConfig,
                       size: int) -> dict | None:
    """The checkpoint to resume from (None for a fresh run), checked against this run."""
    if checkpoint.parent.exists() and not checkpoint.parent.is_dir():
        raise NotADirectoryError(f"out_dir {checkpoint.parent} is a file; it must be a folder "
                                 f"for the checkpoint")
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    if not checkpoint.exists():
        return None
    state = load_checkpoint(checkpoint, task.name)
    # Checkpoints from before the schedule option were all written with the cosine one.
    if {"schedule": "cosine", **state["train_config"]} != dataclasses.asdict(config):
        raise CheckpointError(f"{checkpoint} was written with another configuration "
                              f"({state['train_config']}); use another --out folder")
    written_by = state.get("world_size", 1)  # checkpoints from before torchrun: one process
    if written_by != size:
        raise CheckpointError(
            f"{checkpoint} was written by a run of {written_by} process(es), this run has "
            f"{size}: an epoch's steps and the schedule depend on it; resume with torchrun "
            f"--nproc-per-node {written_by} (or without torchrun for 1), or use another --out "
            f"folder")
    return state


def fit(task: Task, config: TrainConfig, out_dir: str | os.PathLike | None = None,
        progress: bool = True, device: str | torch.device | None = None) -> dict:
    """Trains ``task.model`` on ``device`` (default: where the model is; under torchrun a
    CUDA model goes to the GPU of the local rank); returns {"history": [...per epoch...],
    "seconds": ..., "device": ..., "world_size": ..., "steps_per_epoch", "lr" and
    "warmup_steps" (the ones used: they depend on the world size), and one metric dict per
    split of ``task.final_splits``}; with ``task.select_best`` also "selected_epoch" (from 1)
    and "selected_by", the final splits being measured on that epoch's weights, which the model
    is left with. With ``out_dir``, writes ``checkpoint.pt`` after every epoch and
    resumes from it when it exists (also when it was written on another device).

    Under torchrun it trains with DistributedDataParallel as the module docstring describes;
    the model is left on ``device`` with the same weights in every process."""
    if device is None:
        device = model_device(task.model)
        if device.type == "cuda" and _local_rank() is not None:
            device = "cuda"
    device = resolve_device(device)
    with process_group(device) as (rank, size):
        return _fit(task, config, out_dir, progress and rank == 0, device, rank, size)


def _fit(task: Task, config: TrainConfig, out_dir, progress: bool, device: torch.device,
         rank: int, size: int) -> dict:
    seed_everything(rank_seed(config.seed, rank))
    model = task.model.to(device)
    steps = task.batches_per_epoch // size
    if steps < 1:
        raise ValueError(f"{task.name}: an epoch of {task.batches_per_epoch} batches cannot give "
                         f"each of {size} processes one; use fewer processes")
    # N processes take N times fewer steps on N times larger batches: the linear scaling rule,
    # and a warm-up over the same number of samples (one process: the configuration's own).
    lr, warmup = config.lr * size, -(-config.warmup // size)
    # Made after the model moved, so the optimizer's state lives on the model's device (and a
    # loaded state is moved there by load_state_dict).
    optimizer = OPTIMIZERS[config.optimizer](model.parameters(), lr=lr)
    max_iters = config.epochs * steps
    scheduler = (CosineWarmupScheduler(optimizer, warmup=warmup, max_iters=max_iters)
                 if config.schedule == "cosine" else
                 torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0))
    generator = torch.Generator().manual_seed(config.seed)  # the data's: the same everywhere
    history, start_epoch, seconds = [], 0, 0.0
    best = None  # with task.select_best: {"epoch", "value", "model" (a CPU state dict)}

    checkpoint = Path(out_dir) / "checkpoint.pt" if out_dir is not None else None
    if checkpoint is not None:
        state = _from_rank_zero(lambda: _read_resume_state(checkpoint, task, config, size),
                                device)
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            generator.set_state(state["generator"])
            _set_rng_state(state["rank_rng"][rank] if size > 1 else state["rng"], device)
            history, start_epoch, seconds = state["history"], state["epoch"], state["seconds"]
            best = state.get("best")

    trained = model
    if size > 1:
        trained = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    for epoch in range(start_epoch, config.epochs):
        started = time.perf_counter()
        trained.train()
        losses, accuracies = [], []
        bar = tqdm(_shared_batches(task.train_batches(epoch, generator), rank, size, steps),
                   total=steps, desc=f"{task.name} epoch {epoch + 1}/{config.epochs}",
                   disable=not progress, leave=False)
        for inputs, targets in bar:
            inputs, targets = to_device(inputs, device), to_device(targets, device)
            outputs = trained(inputs)
            loss = task.loss(outputs, targets)
            if size == 1:
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"{task.name}: the loss became {loss.item()} in "
                                             f"epoch {epoch + 1}; lower the learning rate")
            elif _all_sum([float(torch.isfinite(loss))], device)[0] < size:
                # All processes stop together, none waits for the others' gradients.
                raise FloatingPointError(f"{task.name}: the loss became non-finite in at least "
                                         f"one process in epoch {epoch + 1} (here "
                                         f"{loss.item()}); lower the learning rate")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            shown = {"loss": f"{losses[-1]:.4f}"}
            if task.accuracy is not None:
                with torch.no_grad():
                    accuracies.append(float(task.accuracy(outputs, targets)))
                shown["acc"] = f"{accuracies[-1]:.3f}"
            # refresh=False: the bar redraws at its own pace (TQDM_MININTERVAL in logs), not
            # on every step.
            bar.set_postfix(**shown, lr=f"{scheduler.get_last_lr()[0]:.2e}", refresh=False)
        val = _evaluate(task, model, "val", device)
        seconds += time.perf_counter() - started
        if size == 1:
            epoch_record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses))}
            if accuracies:  # measured during training, with dropout on
                epoch_record["train_accuracy"] = float(np.mean(accuracies))
        else:  # the means over every process's batches
            totals = _all_sum([sum(losses), len(losses), sum(accuracies), len(accuracies)],
                              device)
            epoch_record = {"epoch": epoch + 1, "train_loss": totals[0] / totals[1]}
            if totals[3]:
                epoch_record["train_accuracy"] = totals[2] / totals[3]
        history.append({**epoch_record, **val})
        if task.select_best is not None:
            if task.select_best not in val:
                raise KeyError(f"{task.name}: select_best names the validation metric "
                               f"{task.select_best!r}, but evaluate returns only "
                               f"{', '.join(sorted(val))}")
            if best is None or val[task.select_best] > best["value"]:
                best = {"epoch": epoch + 1, "value": val[task.select_best],
                        "model": {name: tensor.detach().to("cpu", copy=True)
                                  for name, tensor in model.state_dict().items()}}
        if progress:
            tqdm.write(f"{task.name} epoch {epoch + 1}: train loss {history[-1]['train_loss']:.4f}"
                       + "".join(f", val {k} {v:.4f}" for k, v in val.items()))
        if checkpoint is not None:
            rng = _rng_state(device)
            state = {"task": task.name, "epoch": epoch + 1, "model": model.state_dict(),
                     "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "generator": generator.get_state(), "rng": rng, "history": history,
                     "seconds": seconds, "train_config": dataclasses.asdict(config),
                     "best": best}
            if size > 1:  # every process's own random state, for a bitwise resume
                rank_rng = [None] * size
                torch.distributed.all_gather_object(rank_rng, rng)
                state.update(rank_rng=rank_rng, world_size=size)
            if rank == 0:
                state["device"] = str(device)  # informational: a resume may use another one
                save_atomically(state, checkpoint)
            if size > 1:  # once any process is past epoch e, its checkpoint is on disk
                torch.distributed.barrier()
    selected = {}
    if best is not None:  # the final splits are measured on the best validation epoch's weights
        model.load_state_dict(best["model"])
        selected = {"selected_epoch": best["epoch"],
                    "selected_by": f"best validation {task.select_best}"}
    return {"history": history, "seconds": seconds, "device": str(device), "world_size": size,
            "steps_per_epoch": steps, "lr": lr, "warmup_steps": warmup, **selected,
            **{split: _evaluate(task, model, split, device) for split in task.final_splits}}
