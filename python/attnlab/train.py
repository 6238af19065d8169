"""One training loop for every experiment: progress bar, cosine warm-up schedule, gradient
clipping, evaluation, a repeatable seed, and a checkpoint at the end of every epoch from which
an interrupted run resumes."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn
from tqdm import tqdm  # the text bar: tqdm.auto warns in kernels without ipywidgets

from .nn import CosineWarmupScheduler

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


@dataclass
class TrainConfig:
    epochs: int = 10
    lr: float = 5e-4
    warmup: int = 50
    grad_clip: float = 5.0
    seed: int = 0
    optimizer: str = "adam"  # or "adamw" (torch's default weight decay, 0.01)

    def __post_init__(self):
        for name in ("epochs", "warmup", "seed"):
            if not isinstance(getattr(self, name), int):
                raise TypeError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, got {self.epochs}")
        # `not x > 0` also refuses NaN, which every comparison lets through.
        if not (math.isfinite(self.lr) and self.lr > 0) or self.warmup < 1 \
                or not self.grad_clip > 0:
            raise ValueError(f"lr (finite), warmup and grad_clip must be positive, got "
                             f"{self.lr}, {self.warmup}, {self.grad_clip}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                             f"{self.optimizer!r}")


@dataclass
class Task:
    """What an experiment gives the loop: a model, its data, its loss and metric.

    ``train_batches(epoch, generator)`` yields (inputs, targets) for one epoch;
    ``evaluate(model, split)`` returns a metric dict for each split in ``final_splits`` (always
    "val" and "test"; "train" where the experiment reports it); ``accuracy(outputs, targets)``,
    when given, is the fraction of a training batch predicted right, shown while training;
    ``examples`` holds inputs the experiment's plots use."""

    name: str
    model: nn.Module
    train_batches: Callable[[int, torch.Generator], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    batches_per_epoch: int
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    evaluate: Callable[[nn.Module, str], dict]
    examples: dict = field(default_factory=dict)
    accuracy: Callable[[torch.Tensor, torch.Tensor], float] | None = None
    final_splits: tuple[str, ...] = ("val", "test")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or does not belong to this run."""


# What fit() writes and reads back on resuming.
CHECKPOINT_KEYS = {"task", "epoch", "model", "optimizer", "scheduler", "generator", "rng",
                   "history", "seconds", "train_config"}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": np.random.get_state()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


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
        raise CheckpointError(f"{path} is not a checkpoint of the {task_name!r} experiment")
    missing = sorted(CHECKPOINT_KEYS - state.keys())
    if missing:
        raise CheckpointError(f"{path} is an incomplete checkpoint: it lacks {', '.join(missing)}")
    return state


def fit(task: Task, config: TrainConfig, out_dir: str | os.PathLike | None = None,
        progress: bool = True) -> dict:
    """Trains ``task.model``; returns {"history": [...per epoch...], "seconds": ..., and one
    metric dict per split of ``task.final_splits``}. With ``out_dir``, writes ``checkpoint.pt`` after every epoch and resumes
    from it when it exists."""
    seed_everything(config.seed)
    model = task.model
    optimizer = OPTIMIZERS[config.optimizer](model.parameters(), lr=config.lr)
    max_iters = config.epochs * task.batches_per_epoch
    scheduler = CosineWarmupScheduler(optimizer, warmup=config.warmup, max_iters=max_iters)
    generator = torch.Generator().manual_seed(config.seed)
    history, start_epoch, seconds = [], 0, 0.0

    checkpoint = Path(out_dir) / "checkpoint.pt" if out_dir is not None else None
    if checkpoint is not None:
        if checkpoint.parent.exists() and not checkpoint.parent.is_dir():
            raise NotADirectoryError(f"out_dir {checkpoint.parent} is a file; it must be a folder "
                                     f"for the checkpoint")
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        if checkpoint.exists():
            state = load_checkpoint(checkpoint, task.name)
            if state["train_config"] != dataclasses.asdict(config):
                raise CheckpointError(f"{checkpoint} was written with another configuration "
                                      f"({state['train_config']}); use another --out folder")
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            generator.set_state(state["generator"])
            _set_rng_state(state["rng"])
            history, start_epoch, seconds = state["history"], state["epoch"], state["seconds"]

    for epoch in range(start_epoch, config.epochs):
        started = time.perf_counter()
        model.train()
        losses, accuracies = [], []
        bar = tqdm(task.train_batches(epoch, generator), total=task.batches_per_epoch,
                   desc=f"{task.name} epoch {epoch + 1}/{config.epochs}", disable=not progress,
                   leave=False)
        for inputs, targets in bar:
            outputs = model(inputs)
            loss = task.loss(outputs, targets)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{task.name}: the loss became {loss.item()} in epoch "
                                         f"{epoch + 1}; lower the learning rate")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            shown = {"loss": f"{losses[-1]:.4f}"}
            if task.accuracy is not None:
                with torch.no_grad():
                    accuracies.append(float(task.accuracy(outputs, targets)))
                shown["acc"] = f"{accuracies[-1]:.3f}"
            bar.set_postfix(**shown, lr=f"{scheduler.get_last_lr()[0]:.2e}")
        val = task.evaluate(model, "val")
        seconds += time.perf_counter() - started
        epoch_record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses))}
        if accuracies:  # measured during training, with dropout on
            epoch_record["train_accuracy"] = float(np.mean(accuracies))
        history.append({**epoch_record, **val})
        if progress:
            tqdm.write(f"{task.name} epoch {epoch + 1}: train loss {history[-1]['train_loss']:.4f}"
                       + "".join(f", val {k} {v:.4f}" for k, v in val.items()))
        if checkpoint is not None:
            save_atomically({"task": task.name, "epoch": epoch + 1, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(),
                             "scheduler": scheduler.state_dict(),
                             "generator": generator.get_state(), "rng": _rng_state(),
                             "history": history, "seconds": seconds,
                             "train_config": dataclasses.asdict(config)}, checkpoint)
    return {"history": history, "seconds": seconds,
            **{split: task.evaluate(model, split) for split in task.final_splits}}
