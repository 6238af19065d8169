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
from .train import resolve_device, save_atomically, seed_everything

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


def _device_suffix(device: torch.device) -> str:
    """Part of a cache file's name: features computed on a GPU differ from the CPU's in the
    last bits, so each device type has its own cache (the CPU's keeps its old name)."""
    return "" if device.type == "cpu" else f"_{device.type}"


def default_cache_dir() -> Path:
    return Path(os.environ.get("ATTNLAB_CACHE", Path.home() / ".cache" / "attnlab"))


def _read_cache(cache: Path) -> dict | None:
    """A cache file's content, or None when it is missing; a damaged one is removed (rebuilt,
    not trusted)."""
    if not cache.exists():
        return None
    try:
        return torch.load(cache, weights_only=False)
    except Exception:
        cache.unlink()
        return None


def fashion_features(data_root=None, cache_dir=None, epochs: int = 2, seed: int = 0,
                     progress: bool = True, device: str | torch.device | None = "cpu") -> dict:
    """{"train": (features [60000, 256], labels), "test": (features [10000, 256], labels),
    "classifier_test_accuracy": float}, from the cache when present; otherwise the CNN is
    trained and run on ``device`` (None: the CPU). The features are returned on the CPU."""
    device = resolve_device(device if device is not None else "cpu")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    # One cache per data folder: features of one copy are never served for another.
    source = Path(data_root if data_root is not None else FASHION_MNIST_DIR).resolve()
    tag = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    cache = cache_dir / (f"fashion_features_v{CACHE_VERSION}_e{epochs}_s{seed}_{tag}"
                         f"{_device_suffix(device)}.pt")
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    data = load_fashion_mnist(data_root)
    seed_everything(seed)
    net = FeatureNet().to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    images, labels = data["train"]
    generator = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(labels), generator=generator)
        for batch in tqdm(order.split(256), desc=f"feature CNN epoch {epoch + 1}/{epochs}",
                          disable=not progress, leave=False):
            loss = nn.functional.cross_entropy(net(_as_input(images[batch].to(device))),
                                               labels[batch].to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    net.eval()
    result = {}
    with torch.no_grad():
        for split, (split_images, split_labels) in data.items():
            result[split] = (torch.cat([net.body(_as_input(chunk.to(device))).cpu()
                                        for chunk in split_images.split(2000)]), split_labels)
        test_images, test_labels = data["test"]
        predictions = torch.cat([net(_as_input(chunk.to(device))).argmax(-1).cpu()
                                 for chunk in test_images.split(2000)])
        result["classifier_test_accuracy"] = (predictions == test_labels).float().mean().item()
    cache_dir.mkdir(parents=True, exist_ok=True)
    save_atomically(result, cache)
    return result


# The tutorial's setting: CIFAR-100 through an ImageNet-trained ResNet-34 without its classifier.
RESNET34_WEIGHTS = "resnet34-b627a593.pth"  # torchvision's file name for the ImageNet weights
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def default_resnet_weights() -> Path:
    """Where torchvision keeps downloaded weights: $TORCH_HOME/hub/checkpoints."""
    return Path(torch.hub.get_dir()) / "checkpoints" / RESNET34_WEIGHTS


def _file_tag(*paths: Path) -> str:
    """Names a cache after its inputs (path, size, modification time)."""
    key = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" if p.is_file()
                   else str(p.resolve()) for p in paths)
    return hashlib.sha1(key.encode()).hexdigest()[:10]


def cifar_resnet_features(data_root, weights=None, image_size: int = 224, cache_dir=None,
                          progress: bool = True, device: str | torch.device | None = "cpu") -> dict:
    """{"train": (features [N, 512], labels), "test": (...), "classes": names}: CIFAR-100
    images resized to ``image_size``, normalised with the ImageNet statistics, through a
    torchvision ResNet-34 whose classifier is removed. ``weights`` is a ResNet-34 state_dict
    file (default: torchvision's ImageNet file in the torch hub cache); nothing is downloaded.
    The ResNet runs on ``device`` (None: the CPU); the features are returned on the CPU."""
    try:
        import torchvision
    except ImportError:
        raise ImportError("the CIFAR-100 path needs torchvision: pip install torchvision") from None
    from .data import DataError, load_cifar100

    weights = Path(weights) if weights is not None else default_resnet_weights()
    if not weights.is_file():
        raise DataError(f"ResNet-34 weights not found at {weights}; put torchvision's "
                        f"{RESNET34_WEIGHTS} (ImageNet) there or pass its path")
    if image_size < 32:
        raise ValueError(f"image_size must be at least 32, got {image_size}")
    device = resolve_device(device if device is not None else "cpu")
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    data_root = Path(data_root)
    cache = cache_dir / (f"cifar100_resnet34_v{CACHE_VERSION}_{image_size}px_"
                         f"{_file_tag(data_root / 'train', data_root / 'test', weights)}"
                         f"{_device_suffix(device)}.pt")
    cached = _read_cache(cache)
    if cached is not None:
        return cached
    data = load_cifar100(data_root)
    net = torchvision.models.resnet34(weights=None)
    try:
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    except Exception as error:
        raise DataError(f"{weights} is not a ResNet-34 state_dict: {error}") from None
    net.fc = nn.Identity()
    net.eval().to(device)
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    result = {"classes": data["classes"]}
    with torch.no_grad():
        for split in ("train", "test"):
            images, labels = data[split]
            chunks = []
            for chunk in tqdm(images.split(64), desc=f"ResNet-34 features ({split})",
                              disable=not progress, leave=False):
                x = nn.functional.interpolate(chunk.to(device).float() / 255.0,
                                              size=image_size, mode="bilinear", antialias=False)
                chunks.append(net((x - mean) / std).cpu())
            result[split] = (torch.cat(chunks), labels)
    cache_dir.mkdir(parents=True, exist_ok=True)
    save_atomically(result, cache)
    return result
