"""An experiment's model as a Lightning module, for users who train with PyTorch Lightning (as
the tutorial does). Optional: needs ``pip install lightning``; the rest of attnlab does not.

    task = reverse.make_task(config)
    module = PredictorModule.from_task(task, config.train)
    lightning.Trainer(max_epochs=config.train.epochs).fit(module, task_loader(task))
    task.evaluate(module.model, "test")

``validation_step`` and ``test_step`` take (inputs, targets) batches from any loader.
"""

from __future__ import annotations

import torch
from torch import nn

try:
    import lightning
except ImportError:
    raise ImportError("attnlab.lightning needs Lightning: pip install lightning") from None

from .nn import CosineWarmupScheduler
from .train import Task, TrainConfig


class PredictorModule(lightning.LightningModule):
    """Wraps a model with its loss and accuracy; Adam with the cosine warm-up schedule, stepped
    every batch. Logs ``{train,val,test}_loss`` and ``{train,val,test}_acc``."""

    def __init__(self, model: nn.Module, loss, accuracy, lr: float, warmup: int, max_iters: int):
        super().__init__()
        if warmup < 1 or max_iters < 1:
            raise ValueError(f"warmup and max_iters must be at least 1, got {warmup}, {max_iters}")
        self.model, self.loss, self.accuracy = model, loss, accuracy
        self.save_hyperparameters(ignore=["model", "loss", "accuracy"])

    @classmethod
    def from_task(cls, task: Task, config: TrainConfig) -> "PredictorModule":
        if task.accuracy is None:
            raise ValueError(f"task {task.name!r} has no batch accuracy to log")
        return cls(task.model, task.loss, task.accuracy, lr=config.lr, warmup=config.warmup,
                   max_iters=config.epochs * task.batches_per_epoch)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.model(x, mask=mask)

    def _step(self, batch, stage: str) -> torch.Tensor:
        inputs, targets = batch
        outputs = self.model(inputs)
        loss = self.loss(outputs, targets)
        self.log(f"{stage}_loss", loss)
        self.log(f"{stage}_acc", self.accuracy(outputs, targets))
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = CosineWarmupScheduler(optimizer, warmup=self.hparams.warmup,
                                          max_iters=self.hparams.max_iters)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        return self.model.get_attention_maps(x, mask=mask)


class _TrainBatches(torch.utils.data.IterableDataset):
    """One epoch of a task's training batches per pass; the epoch counts up with each pass."""

    def __init__(self, task: Task, seed: int):
        self.task, self.generator, self.epoch = task, torch.Generator().manual_seed(seed), 0

    def __iter__(self):
        self.epoch += 1
        return iter(self.task.train_batches(self.epoch - 1, self.generator))

    def __len__(self):
        return self.task.batches_per_epoch


def task_loader(task: Task, seed: int = 0) -> torch.utils.data.DataLoader:
    """A DataLoader over the task's training batches (already batched, drawn as ``fit`` draws
    them)."""
    return torch.utils.data.DataLoader(_TrainBatches(task, seed), batch_size=None)
