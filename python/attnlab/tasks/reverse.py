"""Sequence reversal (the UvA tutorial): 16 digits in [0, 10), one-hot in, the reversed sequence out.
A single attention head learns to look from position i to position 15 − i."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..models import TransformerPredictor
from ..train import Task, TrainConfig, model_device
from .sparsity import (attention_zero_counts, check_experiment_normalizer,
                       checkpoint_task_name, normalizer_suffix)


@dataclass
class ReverseConfig:
    seq_len: int = 16
    num_classes: int = 10
    train_size: int = 50_000
    val_size: int = 1_000
    test_size: int = 10_000
    batch_size: int = 128
    model_dim: int = 32
    num_heads: int = 1
    num_layers: int = 1
    normalizer: str = "softmax"  # the attention's: softmax, sparsemax or entmax15
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        epochs=10, lr=5e-4, warmup=50, grad_clip=5.0))

    def __post_init__(self):
        check_experiment_normalizer(self.normalizer)
        if self.seq_len < 1 or self.num_classes < 2:
            raise ValueError(f"need seq_len >= 1 and num_classes >= 2, got {self.seq_len}, "
                             f"{self.num_classes}")
        if self.batch_size < 1 or self.num_layers < 1 or self.num_heads < 1:
            raise ValueError(f"batch_size, num_layers and num_heads must be at least 1, got "
                             f"{self.batch_size}, {self.num_layers}, {self.num_heads}")
        if self.model_dim % self.num_heads != 0:
            raise ValueError(f"model_dim ({self.model_dim}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.train_size < self.batch_size or min(self.val_size, self.test_size) < 1:
            raise ValueError(f"train_size ({self.train_size}) must hold at least one batch of "
                             f"{self.batch_size}, and val/test sizes must be positive")


def default_config(seed: int = 0) -> ReverseConfig:
    """The UvA tutorial's recipe exactly."""
    return ReverseConfig(train=dataclasses.replace(ReverseConfig().train, seed=seed))


def fast_config(seed: int = 0) -> ReverseConfig:
    """A small run that still reaches ≥ 99 % test accuracy (about 10 s on 2 cores)."""
    return ReverseConfig(train_size=32_000, test_size=2_000,
                         train=dataclasses.replace(ReverseConfig().train, epochs=6, seed=seed))


def one_hot(digits: torch.Tensor, num_classes: int) -> torch.Tensor:
    return F.one_hot(digits, num_classes).float()


def make_task(config: ReverseConfig, device: str | torch.device | None = None) -> Task:
    """The reversal task: data on the CPU, the model built there from the seed, then moved to
    ``device`` (default: stays on the CPU)."""
    data_gen = torch.Generator().manual_seed(config.train.seed + 1)
    splits = {name: torch.randint(config.num_classes, (size, config.seq_len), generator=data_gen)
              for name, size in (("train", config.train_size), ("val", config.val_size),
                                 ("test", config.test_size))}
    torch.manual_seed(config.train.seed)
    model = TransformerPredictor(input_dim=config.num_classes, model_dim=config.model_dim,
                                 num_classes=config.num_classes, num_heads=config.num_heads,
                                 num_layers=config.num_layers, normalizer=config.normalizer)
    if device is not None:
        model.to(device)
    batches = config.train_size // config.batch_size  # the last partial batch is dropped

    def train_batches(epoch, generator):
        order = torch.randperm(config.train_size, generator=generator)
        for b in range(batches):
            digits = splits["train"][order[b * config.batch_size:(b + 1) * config.batch_size]]
            yield one_hot(digits, config.num_classes), digits.flip(1)

    def loss(logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def evaluate_sums(model, split, rank=0, world_size=1):
        model.eval()
        device = model_device(model)
        digits = splits[split][rank::world_size]
        correct = zeros = weights = 0
        for chunk in digits.to(device).split(1000):
            if len(chunk) == 0:
                continue
            inputs = one_hot(chunk, config.num_classes)
            logits, maps = model.forward_with_attention(inputs)
            correct += (logits.argmax(-1) == chunk.flip(1)).sum().item()
            chunk_zeros, chunk_weights = attention_zero_counts(maps)
            zeros, weights = zeros + chunk_zeros, weights + chunk_weights
        return {"accuracy": (correct, digits.numel()),
                "attention_zero_fraction": (zeros, weights)}

    def evaluate(model, split):
        return {name: numerator / denominator
                for name, (numerator, denominator) in evaluate_sums(model, split).items()}

    def accuracy(logits, targets):
        return (logits.argmax(-1) == targets).float().mean()

    return Task(name=task_name(config), model=model, train_batches=train_batches,
                batches_per_epoch=batches, loss=loss, evaluate=evaluate, accuracy=accuracy,
                evaluate_sums=evaluate_sums,
                select_best="accuracy",  # the tutorial tests its best-validation checkpoint
                examples={"attention": one_hot(splits["test"][:1], config.num_classes)})


def attention_example(task: Task):
    """(maps, tokens) of one test sequence: one [1, H, L, L] map per layer (on the CPU), and its
    digits."""
    inputs = task.examples["attention"]
    maps = task.model.get_attention_maps(inputs.to(model_device(task.model)))
    return [m.cpu() for m in maps], [str(d) for d in inputs[0].argmax(-1).tolist()]


def task_name(config: ReverseConfig) -> str:
    """"reverse", or "reverse (sparsemax)" / "reverse (entmax15)": see
    :func:`attnlab.tasks.sparsity.checkpoint_task_name`."""
    return checkpoint_task_name("reverse", config.normalizer)


def run_name(config: ReverseConfig) -> str:
    """The default output folder's name: "reverse", or "reverse-sparsemax" /
    "reverse-entmax15"."""
    return "reverse" + normalizer_suffix(config.normalizer)
