"""Frozen image features for the set-anomaly experiment: a small CNN trained once on the
Fashion-MNIST training split for classification, in the role the ImageNet ResNet plays in the
tutorial. Its penultimate activations are the features; they are cached on disk."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from .data import FASHION_MNIST_DIR, load_fashion_mnist
from .train import save_atomically, seed_everything

FEATURE_DIM = 256
CACHE_VERSION = 1


class FeatureNet(nn.Module):
    """conv 3×3 (32) → pool → conv 3×3 (64) → pool → Linear(3136, 256) → ReLU = features;
    a Linear(256, 10) head trains them."""

    def __init__(self, feature_dim: int = FEATURE_DIM, num_classes: int = 10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, feature_dim), nn.ReLU())
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(images))


def _as_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 [N, 28, 28] → float [N, 1, 28, 28], scaled to [0, 1] and centred."""
    return (images.float().unsqueeze(1) / 255.0 - 0.2860) / 0.3530


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def fashion_features(data_root=None, cache_dir=None, epochs: int = 2, seed: int = 0,
                     progress: bool = True) -> dict:
    """{"train": (features [60000, 256], labels), "test": (features [10000, 256], labels),
    "classifier_test_accuracy": float}, from the cache when present."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    # One cache per data folder: features of one copy are never served for another.
    source = Path(data_root if data_root is not None else FASHION_MNIST_DIR).resolve()
    tag = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    cache = cache_dir / f"fashion_features_v{CACHE_VERSION}_e{epochs}_s{seed}_{tag}.pt"
    if cache.exists():
        try:
            return torch.load(cache, weights_only=False)
        except Exception:  # a damaged cache is rebuilt, not trusted
            cache.unlink()
    data = load_fashion_mnist(data_root)
    seed_everything(seed)
    net = FeatureNet()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    images, labels = data["train"]
    generator = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(labels), generator=generator)
        for batch in tqdm(order.split(256), desc=f"feature CNN epoch {epoch + 1}/{epochs}",
                          disable=not progress, leave=False):
            loss = nn.functional.cross_entropy(net(_as_input(images[batch])), labels[batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    net.eval()
    result = {}
    with torch.no_grad():
        for split, (split_images, split_labels) in data.items():
            result[split] = (torch.cat([net.body(_as_input(chunk)) for chunk in split_images.split(2000)]),
                             split_labels)
        test_images, test_labels = data["test"]
        predictions = torch.cat([net(_as_input(chunk)).argmax(-1) for chunk in test_images.split(2000)])
        result["classifier_test_accuracy"] = (predictions == test_labels).float().mean().item()
    cache_dir.mkdir(parents=True, exist_ok=True)
    save_atomically(result, cache)
    return result
