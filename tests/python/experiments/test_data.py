"""Reading idx files, and every way they can be wrong."""

import gzip

import numpy as np
import pytest
import torch

from attnlab.data import DataError, FASHION_MNIST_DIR, load_fashion_mnist, read_idx


def write_idx(path, array, compress=True):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    (gzip.open if compress else open)(path, "wb").write(data)


def make_fashion_folder(folder, train=12, test=5):
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("t10k", test)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)))
    return folder


def test_round_trip_compressed_and_plain(tmp_path):
    array = np.arange(24).reshape(2, 3, 4)
    write_idx(tmp_path / "a.gz", array)
    write_idx(tmp_path / "b", array, compress=False)
    for name in ("a.gz", "b"):
        assert torch.equal(read_idx(tmp_path / name), torch.tensor(array, dtype=torch.uint8))


def test_small_folder_loads(tmp_path):
    data = load_fashion_mnist(make_fashion_folder(tmp_path))
    assert data["train"][0].shape == (12, 28, 28) and data["test"][1].shape == (5,)
    assert data["train"][1].dtype == torch.int64


BAD_FILES = {
    "truncated data": (lambda p: p.write_bytes(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"abc"),
                       "truncated or padded: its header promises 10 values"),
    "truncated header": (lambda p: p.write_bytes(bytes([0, 0, 8, 3, 0, 0])), "truncated idx header"),
    "bad magic": (lambda p: p.write_bytes(b"PK\x03\x04 not idx"), "bad magic number"),
    "float idx": (lambda p: p.write_bytes(bytes([0, 0, 0x0D, 1]) + (1).to_bytes(4, "big") + b"\0\0\0\0"), "only unsigned bytes"),
    "corrupt gzip": (lambda p: p.write_bytes(b"\x1f\x8b\x08\x00garbage"), "not a readable idx file"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_idx_files_raise_clear_errors(tmp_path, name):
    make, message = BAD_FILES[name]
    path = tmp_path / ("f.gz" if name == "corrupt gzip" else "f")
    make(path)
    with pytest.raises(DataError, match=message):
        read_idx(path)


def test_truncated_gzip_member(tmp_path):
    write_idx(tmp_path / "full.gz", np.zeros((100, 28, 28)))
    data = (tmp_path / "full.gz").read_bytes()
    (tmp_path / "cut.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="not a readable idx file"):
        read_idx(tmp_path / "cut.gz")


def test_missing_folder_names_the_debian_package(tmp_path, monkeypatch):
    monkeypatch.setattr("attnlab.data.FASHION_MNIST_DIR", tmp_path / "nowhere")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_fashion_mnist()
    with pytest.raises(DataError, match="pass a folder holding"):
        load_fashion_mnist(tmp_path / "other")


def test_missing_file_and_mismatched_counts(tmp_path):
    folder = make_fashion_folder(tmp_path)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz does not exist"):
        load_fashion_mnist(folder)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(4))
    with pytest.raises(DataError, match="do not match"):
        load_fashion_mnist(folder)


@pytest.mark.skipif(not FASHION_MNIST_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_real_fashion_mnist():
    data = load_fashion_mnist()
    assert data["train"][0].shape == (60000, 28, 28) and data["test"][0].shape == (10000, 28, 28)
    assert torch.bincount(data["train"][1]).tolist() == [6000] * 10


def test_feature_extractor_shapes_and_cache(tmp_path):
    from attnlab.features import FEATURE_DIM, fashion_features
    (tmp_path / "data").mkdir()
    folder = make_fashion_folder(tmp_path / "data", train=300, test=40)
    first = fashion_features(data_root=folder, cache_dir=tmp_path / "cache", epochs=1,
                             progress=False)
    assert first["train"][0].shape == (300, FEATURE_DIM) and first["test"][0].shape == (40, FEATURE_DIM)
    assert (first["train"][0] >= 0).all()  # ReLU features
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1
    second = fashion_features(data_root=folder, cache_dir=tmp_path / "cache", epochs=1,
                              progress=False)
    assert torch.equal(first["train"][0], second["train"][0])
    assert len(list((tmp_path / "cache").iterdir())) == 1  # served from the cache
    with pytest.raises(DataError, match="pass a folder holding"):  # another folder: no reuse
        fashion_features(data_root=tmp_path / "elsewhere", cache_dir=tmp_path / "cache",
                         epochs=1, progress=False)
    cached[0].write_bytes(b"damaged")  # a damaged cache is rebuilt
    third = fashion_features(data_root=folder, cache_dir=tmp_path / "cache", epochs=1,
                             progress=False)
    assert torch.equal(first["train"][0], third["train"][0])
