"""Set anomaly detection (SPEC.md §2) on Fashion-MNIST: in a set of ten images, nine share a
class; find the tenth. The model gets frozen CNN features and no positions, so it can only
compare the elements with each other, through attention."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import plot
from ..data import FASHION_MNIST_CLASSES, load_fashion_mnist
from ..features import fashion_features
from ..models import TransformerPredictor
from ..train import Task, TrainConfig
from .anomaly_sets import SET_SIZE, sample_sets, validation_split


@dataclass
class AnomalyConfig:
    data: str | None = None          # folder of the Fashion-MNIST idx files; None: Debian's
    feature_epochs: int = 2          # training of the frozen feature CNN (cached)
    model_dim: int = 256
    num_heads: int = 4
    num_layers: int = 4
    dropout: float = 0.1
    input_dropout: float = 0.1
    batch_size: int = 64
    sets_per_epoch: int | None = None  # None: one set per training image, as the tutorial
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        epochs=100, lr=5e-4, warmup=100, grad_clip=2.0))

    def __post_init__(self):
        if min(self.batch_size, self.num_layers, self.num_heads, self.feature_epochs) < 1:
            raise ValueError(f"batch_size, num_layers, num_heads and feature_epochs must be at "
                             f"least 1, got {self.batch_size}, {self.num_layers}, "
                             f"{self.num_heads}, {self.feature_epochs}")
        if self.model_dim % self.num_heads != 0:
            raise ValueError(f"model_dim ({self.model_dim}) must be divisible by num_heads "
                             f"({self.num_heads})")
        for name in ("dropout", "input_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.sets_per_epoch is not None and self.sets_per_epoch < self.batch_size:
            raise ValueError(f"sets_per_epoch ({self.sets_per_epoch}) must hold at least one "
                             f"batch of {self.batch_size}")


def default_config(seed: int = 0) -> AnomalyConfig:
    """SPEC.md §2's model and recipe (100 epochs: hours on 2 CPU cores)."""
    return AnomalyConfig(train=dataclasses.replace(AnomalyConfig().train, seed=seed))


def fast_config(seed: int = 0) -> AnomalyConfig:
    """Same model, 3 short epochs of 6,400 sets."""
    return AnomalyConfig(sets_per_epoch=6400,
                         train=dataclasses.replace(AnomalyConfig().train, epochs=3, seed=seed))


def make_task(config: AnomalyConfig, progress: bool = True) -> Task:
    features = fashion_features(config.data, epochs=config.feature_epochs, progress=progress)
    train_features, train_labels = features["train"]
    train_idx, val_idx = validation_split(train_labels)
    pools = {"train": (train_features[train_idx], train_labels[train_idx]),
             "val": (train_features[val_idx], train_labels[val_idx]),
             "test": features["test"]}
    fixed = {split: sample_sets(pools[split][1], torch.arange(len(pools[split][1])),
                                torch.Generator().manual_seed(1000 + i))
             for i, split in enumerate(("val", "test"))}
    torch.manual_seed(config.train.seed)
    model = TransformerPredictor(input_dim=train_features.shape[1], model_dim=config.model_dim,
                                 num_classes=1, num_heads=config.num_heads,
                                 num_layers=config.num_layers, dropout=config.dropout,
                                 input_dropout=config.input_dropout, positional_encoding=False)
    pool_size = len(pools["train"][1])
    sets_per_epoch = min(config.sets_per_epoch or pool_size, pool_size)
    batches = sets_per_epoch // config.batch_size

    def train_batches(epoch, generator):
        # Fresh sets every epoch: the anomalies in random order, new companions for each.
        anomalies = torch.randperm(pool_size, generator=generator)[:sets_per_epoch]
        sets = sample_sets(pools["train"][1], anomalies, generator)
        for b in range(batches):
            chunk = sets[b * config.batch_size:(b + 1) * config.batch_size]
            yield pools["train"][0][chunk], torch.full((len(chunk),), SET_SIZE - 1)

    def loss(logits, targets):  # softmax over the set's elements
        return F.cross_entropy(logits.squeeze(-1), targets)

    @torch.no_grad()
    def evaluate(model, split):
        model.eval()
        sets = fixed[split]
        found = torch.cat([model(pools[split][0][chunk]).squeeze(-1).argmax(-1)
                           for chunk in sets.split(500)])
        return {"accuracy": (found == SET_SIZE - 1).float().mean().item()}

    return Task(name="anomaly", model=model, train_batches=train_batches,
                batches_per_epoch=batches, loss=loss, evaluate=evaluate,
                examples={"test_sets": fixed["test"], "test_features": pools["test"][0],
                          "test_labels": pools["test"][1], "data": config.data})


def attention_example(task: Task):
    """(maps, tokens) of one test set: one [1, H, 10, 10] map per layer, and its class names."""
    first = task.examples["test_sets"][:1]
    maps = task.model.get_attention_maps(task.examples["test_features"][first])
    return maps, [FASHION_MNIST_CLASSES[c][:7] for c in task.examples["test_labels"][first[0]].tolist()]


@torch.no_grad()
def extra_figures(task: Task, shown: int = 4) -> dict:
    """{"sets": the first test sets with the model's probabilities, "mistakes": test sets the
    model gets wrong} as figures of the images."""
    task.model.eval()
    sets = task.examples["test_sets"]
    probabilities = torch.cat([task.model(task.examples["test_features"][chunk]).squeeze(-1)
                               .softmax(-1) for chunk in sets.split(500)])
    images = load_fashion_mnist(task.examples["data"])["test"][0]
    labels = task.examples["test_labels"]

    def figure(rows, title):
        rows = rows[:shown]
        names = [[FASHION_MNIST_CLASSES[c][:11] for c in labels[sets[r]].tolist()] for r in rows]
        return plot.image_sets(images[sets[rows]], probabilities[rows], names, title)

    wrong = (probabilities.argmax(-1) != SET_SIZE - 1).nonzero().flatten()
    figures = {"sets": figure(torch.arange(len(sets)), "test sets: the anomaly is framed green")}
    if len(wrong):
        figures["mistakes"] = figure(wrong, f"{len(wrong)} of {len(sets)} test sets missed "
                                            f"(model's pick in red)")
    return figures
