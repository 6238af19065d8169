"""Data sets read from local files: no downloads at run time.

Fashion-MNIST comes from Debian's package ``dataset-fashion-mnist`` (the standard idx files in
/usr/share/datasets/fashion-mnist), or any folder holding the same four files. CIFAR-100, for
the tutorial's own set-anomaly setting, comes from a folder the user gives."""

from __future__ import annotations

import codecs
import gzip
import os
import pickle
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


# CIFAR-100, "python version" (cifar-100-python.tar.gz unpacked): the files train, test and meta,
# each a pickled dict. The reader unpickles only plain containers and numpy arrays.
CIFAR100_FILES = ("train", "test", "meta")


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """Refuses every global but the ones a pickled numpy array needs, so a foreign pickle cannot
    run code while it is read."""

    # Named as the pickle names them; looked up on numpy objects, not by import, because
    # numpy 2 moved (and deprecated) numpy.core. Protocol 2 (Python 2's files) rebuilds arrays
    # with _reconstruct and Python 3 bytes with _codecs.encode; protocol 5 uses _frombuffer.
    ALLOWED = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
               ("_codecs", "encode"): codecs.encode}
    for _module in ("numpy.core", "numpy._core"):
        ALLOWED[f"{_module}.multiarray", "_reconstruct"] = np.ndarray((0,)).__reduce__()[0]
        ALLOWED[f"{_module}.numeric", "_frombuffer"] = np.zeros(1).__reduce_ex__(5)[0]
    del _module

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return self.ALLOWED[module, name]
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_cifar_pickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            content = _ArraysOnlyUnpickler(f, encoding="latin1").load()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; expected the CIFAR-100 python version's "
                        f"files {', '.join(CIFAR100_FILES)} in {path.parent}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, OSError) as error:
        raise DataError(f"{path} is not a readable CIFAR-100 pickle: {error}") from None
    if not isinstance(content, dict):
        raise DataError(f"{path} holds a {type(content).__name__}, not a CIFAR-100 dict")
    return content


def load_cifar100(root: str | os.PathLike) -> dict:
    """{"train": (images [N, 3, 32, 32] uint8, fine labels [N] int64), "test": (...),
    "classes": [100 names]} from a ``cifar-100-python`` folder."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(f"CIFAR-100 not found: {root} is not a folder; pass the unpacked "
                        f"cifar-100-python folder (files {', '.join(CIFAR100_FILES)})")
    classes = _read_cifar_pickle(root / "meta").get("fine_label_names")
    if not isinstance(classes, list) or not classes:
        raise DataError(f"{root / 'meta'} has no fine_label_names list")
    result = {"classes": [str(c) for c in classes]}
    for split in ("train", "test"):
        content = _read_cifar_pickle(root / split)
        data, labels = content.get("data"), content.get("fine_labels")
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
                or data.shape[1] != 3 * 32 * 32:
            raise DataError(f"{root / split}: 'data' must be a uint8 array [N, 3072], got "
                            f"{getattr(data, 'dtype', type(data).__name__)} "
                            f"{list(getattr(data, 'shape', []))}")
        if len(data) == 0:
            raise DataError(f"{root / split} holds no images")
        if labels is None or len(labels) != len(data):
            raise DataError(f"{root / split}: 'fine_labels' must hold one label per image "
                            f"({len(data)}), got {None if labels is None else len(labels)}")
        labels = torch.as_tensor(np.asarray(labels, dtype=np.int64))
        if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= len(classes)):
            raise DataError(f"{root / split}: labels must lie in [0, {len(classes)}), got "
                            f"[{int(labels.min())}, {int(labels.max())}]")
        images = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
        result[split] = (images, labels)
    return result


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
