"""Set anomaly detection (the UvA tutorial): in a set of ten images, nine share a class; find the
tenth. The model gets frozen CNN features and no positions, so it can only compare the elements
with each other, through attention. Fashion-MNIST with our own feature CNN by default; the
tutorial's CIFAR-100 with an ImageNet ResNet-34 for users who have both."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .. import plot
from ..data import FASHION_MNIST_CLASSES, load_cifar100, load_fashion_mnist
from ..features import cifar_resnet_features, fashion_features
from ..models import TransformerPredictor
from ..train import Task, TrainConfig, leaders_first, model_device
from .anomaly_sets import SET_SIZE, sample_sets, validation_split
from .sparsity import (attention_zero_counts, check_experiment_normalizer,
                       checkpoint_task_name, normalizer_suffix)


DATASETS = ("fashion-mnist", "cifar100")


@dataclass
class AnomalyConfig:
    dataset: str = "fashion-mnist"   # or "cifar100" (needs data, torchvision and weights)
    data: str | None = None          # Fashion-MNIST idx folder (None: Debian's) or cifar-100-python
    feature_epochs: int = 2          # training of the frozen Fashion-MNIST feature CNN (cached)
    weights: str | None = None       # cifar100: ResNet-34 state_dict (None: torch hub cache)
    image_size: int = 224            # cifar100: images are resized to this for the ResNet
    model_dim: int = 256
    num_heads: int = 4
    num_layers: int = 4
    dropout: float = 0.1
    input_dropout: float = 0.1
    batch_size: int = 64
    sets_per_epoch: int | None = None  # None: one set per training image, as the tutorial
    normalizer: str = "softmax"      # the attention's: softmax, sparsemax or entmax15
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        epochs=100, lr=5e-4, warmup=100, grad_clip=2.0))

    def __post_init__(self):
        check_experiment_normalizer(self.normalizer)
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.dataset == "cifar100" and self.data is None:
            raise ValueError("dataset cifar100 needs data: the unpacked cifar-100-python folder")
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
    """The UvA tutorial's model and recipe (100 epochs: hours on 2 CPU cores)."""
    return AnomalyConfig(train=dataclasses.replace(AnomalyConfig().train, seed=seed))


def fast_config(seed: int = 0) -> AnomalyConfig:
    """Same model, 3 short epochs of 6,400 sets."""
    return AnomalyConfig(sets_per_epoch=6400,
                         train=dataclasses.replace(AnomalyConfig().train, epochs=3, seed=seed))


def load_features(config: AnomalyConfig, progress: bool = True,
                  device: str | torch.device | None = None) -> dict:
    """Frozen features and class names of the configured data set (cached on disk), computed
    on ``device`` (default the CPU) when not cached; returned on the CPU. Under torchrun
    process 0 computes them first and the others read its cache."""
    if config.dataset == "cifar100":
        return leaders_first(lambda: cifar_resnet_features(
            config.data, config.weights, image_size=config.image_size, progress=progress,
            device=device))
    return {**leaders_first(lambda: fashion_features(config.data, epochs=config.feature_epochs,
                                                     progress=progress, device=device)),
            "classes": FASHION_MNIST_CLASSES}


def load_images(config: AnomalyConfig, split: str) -> torch.Tensor:
    """The images behind the features, for figures: [N, H, W] or [N, 3, H, W] uint8."""
    if config.dataset == "cifar100":
        return load_cifar100(config.data)[split][0]
    return load_fashion_mnist(config.data)[split][0]


def make_task(config: AnomalyConfig, progress: bool = True,
              device: str | torch.device | None = None) -> Task:
    """The set-anomaly task: features (extracted on ``device`` when not cached) and sets on
    the CPU, the model built there from the seed, then moved to ``device``."""
    features = load_features(config, progress, device)
    train_features, train_labels = features["train"]
    train_idx, val_idx = validation_split(train_labels)
    pools = {"train": (train_features[train_idx], train_labels[train_idx]),
             "val": (train_features[val_idx], train_labels[val_idx]),
             "test": features["test"]}
    # Fixed sets: one per image as the anomaly for validation and test; "train" measures the fit
    # on a draw of training sets as many as the test sets (training sees new sets every epoch).
    fixed = {split: sample_sets(pools[split][1], torch.arange(len(pools[split][1])),
                                torch.Generator().manual_seed(1000 + i))
             for i, split in enumerate(("val", "test"))}
    draw = torch.Generator().manual_seed(1002)
    train_anomalies = torch.randperm(len(pools["train"][1]), generator=draw)[:len(fixed["test"])]
    fixed["train"] = sample_sets(pools["train"][1], train_anomalies, draw)
    torch.manual_seed(config.train.seed)
    model = TransformerPredictor(input_dim=train_features.shape[1], model_dim=config.model_dim,
                                 num_classes=1, num_heads=config.num_heads,
                                 num_layers=config.num_layers, dropout=config.dropout,
                                 input_dropout=config.input_dropout, positional_encoding=False,
                                 normalizer=config.normalizer)
    if device is not None:
        model.to(device)
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
    def picks(model, split, rows=slice(None)):
        """The element called the anomaly, per set, and the (exactly-zero, counted) weights of
        the sets' attention maps (every layer, head and row)."""
        model.eval()
        device = model_device(model)
        sets = fixed[split][rows]
        found, zeros, weights = [], 0, 0
        for chunk in sets.split(500):
            inputs = pools[split][0][chunk].to(device)
            logits, maps = model.forward_with_attention(inputs)
            found.append(logits.squeeze(-1).argmax(-1).cpu())
            chunk_zeros, chunk_weights = attention_zero_counts(maps)
            zeros, weights = zeros + chunk_zeros, weights + chunk_weights
        return (torch.cat(found) if found else torch.empty(0, dtype=torch.long)), zeros, weights

    def evaluate(model, split):
        found, zeros, weights = picks(model, split)
        return {"accuracy": (found == SET_SIZE - 1).float().mean().item(),
                "attention_zero_fraction": zeros / weights}

    def evaluate_sums(model, split, rank=0, world_size=1):
        found, zeros, weights = picks(model, split, slice(rank, None, world_size))
        return {"accuracy": (int((found == SET_SIZE - 1).sum()), len(found)),
                "attention_zero_fraction": (zeros, weights)}

    def accuracy(logits, targets):
        return (logits.squeeze(-1).argmax(-1) == targets).float().mean()

    return Task(name=task_name(config), model=model, train_batches=train_batches,
                batches_per_epoch=batches, loss=loss, evaluate=evaluate, accuracy=accuracy,
                final_splits=("train", "val", "test"), evaluate_sums=evaluate_sums,
                select_best="accuracy",  # the tutorial tests its best-validation checkpoint
                examples={"test_sets": fixed["test"], "test_features": pools["test"][0],
                          "test_labels": pools["test"][1], "classes": features["classes"],
                          "config": config})


def attention_example(task: Task):
    """(maps, tokens) of one test set: one [1, H, 10, 10] map per layer (on the CPU), and its
    class names."""
    first = task.examples["test_sets"][:1]
    maps = task.model.get_attention_maps(
        task.examples["test_features"][first].to(model_device(task.model)))
    maps = [m.cpu() for m in maps]
    classes = task.examples["classes"]
    return maps, [classes[c][:7] for c in task.examples["test_labels"][first[0]].tolist()]


def task_name(config: AnomalyConfig) -> str:
    """"anomaly", or "anomaly (sparsemax)" / "anomaly (entmax15)": see
    :func:`attnlab.tasks.sparsity.checkpoint_task_name`."""
    return checkpoint_task_name("anomaly", config.normalizer)


def run_name(config: AnomalyConfig) -> str:
    """The default output folder's name: "anomaly", "anomaly-sparsemax" or
    "anomaly-entmax15"."""
    return "anomaly" + normalizer_suffix(config.normalizer)


@torch.no_grad()
def extra_figures(task: Task, shown: int = 4) -> dict:
    """{"sets": the first test sets with the model's probabilities, "mistakes": test sets the
    model gets wrong} as figures of the images."""
    task.model.eval()
    sets, device = task.examples["test_sets"], model_device(task.model)
    probabilities = torch.cat([task.model(task.examples["test_features"][chunk].to(device))
                               .squeeze(-1).softmax(-1).cpu() for chunk in sets.split(500)])
    images = load_images(task.examples["config"], "test")
    labels, classes = task.examples["test_labels"], task.examples["classes"]

    def figure(rows, title):
        rows = rows[:shown]
        names = [[classes[c][:11] for c in labels[sets[r]].tolist()] for r in rows]
        return plot.image_sets(images[sets[rows]], probabilities[rows], names, title)

    wrong = (probabilities.argmax(-1) != SET_SIZE - 1).nonzero().flatten()
    figures = {"sets": figure(torch.arange(len(sets)), "test sets: the anomaly is framed green")}
    if len(wrong):
        figures["mistakes"] = figure(wrong, f"{len(wrong)} of {len(sets)} test sets missed "
                                            f"(model's pick in red)")
    return figures
