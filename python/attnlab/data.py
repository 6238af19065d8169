"""Data sets read from local files: no downloads at run time.

Fashion-MNIST comes from Debian's package ``dataset-fashion-mnist`` (the standard idx files in
/usr/share/datasets/fashion-mnist), or any folder holding the same four files."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot"]


class DataError(ValueError):
    """A data file that is missing, truncated or not what it claims to be."""


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """An idx file (gzip-compressed or not) of unsigned bytes as a uint8 tensor of its shape."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist") from None
    except (OSError, EOFError) as error:  # gzip: corrupt or truncated stream
        raise DataError(f"{path} is not a readable idx file: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(f"{path} is not an idx file (bad magic number)")
    if raw[2] != 0x08:
        raise DataError(f"{path} holds idx type 0x{raw[2]:02x}; only unsigned bytes (0x08) are "
                        f"supported")
    dims = raw[3]
    header = 4 + 4 * dims
    if dims == 0 or len(raw) < header:
        raise DataError(f"{path} has a truncated idx header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(f"{path} is truncated or padded: its header promises {expected} values "
                        f"of shape {list(shape)}, the file holds {len(raw) - header}")
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape).copy())


def load_fashion_mnist(root: str | os.PathLike | None = None) -> dict:
    """{"train": (images [60000, 28, 28] uint8, labels [60000] int64), "test": (... 10000 ...)}."""
    root = Path(root) if root is not None else FASHION_MNIST_DIR
    if not root.is_dir():
        hint = ("install Debian's package dataset-fashion-mnist (apt-get install "
                "dataset-fashion-mnist)" if root == FASHION_MNIST_DIR else
                "pass a folder holding the four Fashion-MNIST idx files")
        raise DataError(f"Fashion-MNIST not found: {root} is not a folder; {hint}")
    splits = {}
    for split, (image_file, label_file) in FASHION_MNIST_FILES.items():
        images, labels = read_idx(root / image_file), read_idx(root / label_file)
        if images.dim() != 3 or labels.dim() != 1 or images.shape[0] != labels.shape[0]:
            raise DataError(f"{root}: {split} images {list(images.shape)} and labels "
                            f"{list(labels.shape)} do not match")
        if labels.numel() and int(labels.max()) >= len(FASHION_MNIST_CLASSES):
            raise DataError(f"{root / label_file}: label {int(labels.max())} is not a class")
        splits[split] = (images, labels.long())
    return splits


# The Large Movie Review Dataset (Maas et al. 2011), unpacked from aclImdb_v1.tar.gz.
IMDB_SPLITS = ("train", "test")
IMDB_LABELS = ("neg", "pos")  # label 0 = negative, 1 = positive
IMDB_HINT = ("download aclImdb_v1.tar.gz (https://ai.stanford.edu/~amaas/data/sentiment/) on a "
             "machine with internet access, unpack it and pass the aclImdb folder with --data; "
             "it cannot be downloaded from here")


def load_imdb(root: str | os.PathLike | None) -> dict:
    """{"train": (texts, labels), "test": (texts, labels)} from an ``aclImdb`` folder laid out as
    ``{train,test}/{pos,neg}/*.txt``; labels are 0 (neg) and 1 (pos), files in name order."""
    if root is None:
        raise DataError(f"the text experiment needs the IMDB corpus: {IMDB_HINT}")
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"IMDB corpus not found: {root} is not a folder; {IMDB_HINT}")
    missing = [f"{split}/{label}" for split in IMDB_SPLITS for label in IMDB_LABELS
               if not (root / split / label).is_dir()]
    if missing:
        raise DataError(f"{root} is not an aclImdb folder: it lacks the sub-folder(s) "
                        f"{', '.join(missing)} (expected train/neg, train/pos, test/neg, "
                        f"test/pos, each holding one review per .txt file)")
    splits = {}
    for split in IMDB_SPLITS:
        texts, labels = [], []
        for label, name in enumerate(IMDB_LABELS):
            files = sorted((root / split / name).glob("*.txt"))
            if not files:
                raise DataError(f"{root / split / name} holds no .txt reviews")
            for file in files:
                try:
                    texts.append(file.read_text(encoding="utf-8", errors="replace"))
                except OSError as error:
                    raise DataError(f"cannot read review {file}: {error}") from None
            labels += [label] * len(files)
        splits[split] = (texts, torch.tensor(labels))
    return splits
