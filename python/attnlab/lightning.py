"""An experiment's model as a Lightning module, for users who train with PyTorch Lightning (as
the tutorial does). Optional: needs ``pip install lightning``; the rest of attnlab does not.

    task = reverse.make_task(config)
    module = PredictorModule.from_task(task, config.train)
    lightning.Trainer(max_epochs=config.train.epochs).fit(module, task_loader(task))
    task.evaluate(module.model, "test")

``validation_step`` and ``test_step`` take (inputs, targets) batches from any loader.

Several processes: ``lightning.Trainer(strategy="ddp", devices=N)`` (also with
``accelerator="cpu"``, or under torchrun) trains it with DistributedDataParallel as
``attnlab.train.fit`` does: ``task_loader`` gives process r the batches r, r + N, ... of each
epoch, the learning rate is multiplied by N and the warm-up divided by N. A run resumed from an
end-of-epoch checkpoint (``ckpt_path=``) draws the batches the uninterrupted run would have
drawn.
"""

from __future__ import annotations

import math

import torch
from torch import nn

try:
    import lightning
except ImportError:
    raise ImportError("attnlab.lightning needs Lightning: pip install lightning") from None

from .nn import CosineWarmupScheduler
from .train import Task, TrainConfig, _shared_batches, world


class PredictorModule(lightning.LightningModule):
    """Wraps a model with its loss and accuracy; Adam with the cosine warm-up schedule, stepped
    every batch. Logs ``{train,val,test}_loss`` and ``{train,val,test}_acc``.

    ``max_iters`` is the schedule's length in optimizer steps. Without it: the Trainer's
    ``max_steps`` when set, else ``max_epochs`` times each process's share of
    ``batches_per_epoch`` (the one-process count of batches, as ``task_loader`` divides them),
    else Lightning's ``estimated_stepping_batches`` (which, when asked this early, keeps a
    resumed run from restoring ``task_loader``'s position: give ``batches_per_epoch``).
    With N processes, ``lr`` is multiplied by N and ``warmup`` divided by N (rounded up), as in
    ``attnlab.train.fit``."""

    def __init__(self, model: nn.Module, loss, accuracy, lr: float, warmup: int,
                 max_iters: int | None = None, batches_per_epoch: int | None = None):
        super().__init__()
        if warmup < 1 or (max_iters is not None and max_iters < 1) \
                or (batches_per_epoch is not None and batches_per_epoch < 1):
            raise ValueError(f"warmup, max_iters and batches_per_epoch must be at least 1, got "
                             f"{warmup}, {max_iters}, {batches_per_epoch}")
        self.model, self.loss, self.accuracy = model, loss, accuracy
        self.save_hyperparameters(ignore=["model", "loss", "accuracy"])

    @classmethod
    def from_task(cls, task: Task, config: TrainConfig) -> "PredictorModule":
        """The task's model, loss and accuracy with the configuration's learning rate and
        warm-up; the schedule spans the Trainer's steps (train ``config.epochs`` epochs)."""
        if task.accuracy is None:
            raise ValueError(f"task {task.name!r} has no batch accuracy to log")
        return cls(task.model, task.loss, task.accuracy, lr=config.lr, warmup=config.warmup,
                   batches_per_epoch=task.batches_per_epoch)

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

    def _schedule_length(self) -> int:
        trainer, hparams = self.trainer, self.hparams
        if hparams.max_iters is not None:
            return hparams.max_iters
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return trainer.max_steps
        if hparams.batches_per_epoch is not None and trainer.accumulate_grad_batches == 1 \
                and trainer.max_epochs is not None and trainer.max_epochs > 0:
            return trainer.max_epochs * max(1, hparams.batches_per_epoch // trainer.world_size)
        return trainer.estimated_stepping_batches

    def configure_optimizers(self):
        processes = self.trainer.world_size
        max_iters = self._schedule_length()
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr * processes)
        scheduler = CosineWarmupScheduler(optimizer,
                                          warmup=math.ceil(self.hparams.warmup / processes),
                                          max_iters=int(max_iters))
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def on_train_epoch_start(self):
        """Tells a ``task_loader`` which epoch to draw (the Trainer's, also after a resume)."""
        dataset = getattr(self.trainer.train_dataloader, "dataset", None)
        if isinstance(dataset, _TrainBatches):
            dataset.epoch = self.current_epoch

    def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        return self.model.get_attention_maps(x, mask=mask)


class _TrainBatches(torch.utils.data.IterableDataset):
    """One epoch of a task's training batches per pass (this process's share of them under
    several processes), drawn from one generator as ``attnlab.train.fit`` draws them.

    The epoch is the Trainer's (set by ``PredictorModule`` as each epoch starts), else one more
    than the last pass's; the generator replays the draws of the epochs before it when needed,
    so a run resumed from an end-of-epoch checkpoint gets the batches the uninterrupted run
    got. Nothing is drawn before the first batch is asked for."""

    def __init__(self, task: Task, seed: int):
        self.task, self.seed = task, seed
        self.epoch = None       # the epoch to draw next, when told (PredictorModule)
        self._drawn = 0         # epochs whose draws the generator has made
        self._generator = torch.Generator().manual_seed(seed)

    def __iter__(self):
        return self._batches()

    def _batches(self):
        epoch = self.epoch if self.epoch is not None else self._drawn
        if epoch < self._drawn:  # an earlier epoch again: from the start
            self._drawn, self._generator = 0, torch.Generator().manual_seed(self.seed)
        while self._drawn < epoch:  # the draws of the epochs before it
            for _ in self.task.train_batches(self._drawn, self._generator):
                pass
            self._drawn += 1
        self._drawn += 1
        self.epoch = None
        rank, size = world()
        yield from _shared_batches(self.task.train_batches(epoch, self._generator), rank, size,
                                   len(self))

    def __len__(self):
        return self.task.batches_per_epoch // world()[1]


def task_loader(task: Task, seed: int = 0) -> torch.utils.data.DataLoader:
    """A DataLoader over the task's training batches (already batched, drawn as ``fit`` draws
    them; under several processes each takes its share, as in ``fit``)."""
    return torch.utils.data.DataLoader(_TrainBatches(task, seed), batch_size=None)
