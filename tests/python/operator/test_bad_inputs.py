"""The bad-input catalogue: every way a user can get an argument wrong, one test per case.

Each case raises an exception of a fitting type whose message says what was wrong and what was
expected; the command line exits non-zero with one line on stderr and no traceback. The
operators' basic shape and dtype cases are in test_attention_bad_input.py."""

import gzip
import math
import re

import numpy as np
import pytest
import torch

import attnlab
from attnlab import cli
from attnlab import nn as attn_nn
from attnlab.data import DataError, load_fashion_mnist, load_imdb, read_idx
from attnlab.tasks import anomaly, reverse
from attnlab.train import CheckpointError, TrainConfig, fit, load_checkpoint

q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 3)
qp, kp, w = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(4)
sdpa = attnlab.scaled_dot_product_attention
additive = torch.ops.attnlab.additive_scores


def sdpa_forward_outputs():
    return torch.ops.attnlab._sdpa_forward(q, k, v, None, False, None, False)


def sdpa_backward(**overrides):
    output, logsumexp, _ = sdpa_forward_outputs()
    args = dict(grad_output=torch.ones_like(output), query=q, key=k, value=v, attn_mask=None,
                is_causal=False, scale=None, output=output, logsumexp=logsumexp) | overrides
    return torch.ops.attnlab._sdpa_backward(*args.values())


def sparse_backward(**overrides):
    output, tau, support_value, _ = torch.ops.attnlab._sparse_sdpa_forward(
        q, k, v, None, False, None, False, 2.0)
    args = dict(grad_output=torch.ones_like(output), query=q, key=k, value=v, attn_mask=None,
                is_causal=False, scale=None, output=output, tau=tau,
                support_value=support_value, alpha=2.0) | overrides
    return torch.ops.attnlab._sparse_sdpa_backward(*args.values())


OPERATORS = {
    "query is a list": (lambda: sdpa([[1.0]], k, v), TypeError,
                        r"query must be a torch.Tensor, got list"),
    "query is None": (lambda: sdpa(None, k, v), TypeError,
                      r"query must be a torch.Tensor, got NoneType"),
    "operator, query is None": (
        lambda: torch.ops.attnlab.scaled_dot_product_attention(
            None, k, v, None, False, None, False, "softmax", None),
        RuntimeError, r"query is an undefined tensor"),
    "complex query": (lambda: sdpa(q.to(torch.complex64), k, v), RuntimeError,
                      r"query must be float32, float64, float16 or bfloat16 on the CPU, got ComplexFloat"),
    "scale is a string": (lambda: sdpa(q, k, v, scale="0.5"), TypeError,
                          r"scale must be a number or None, got str '0.5'"),
    "mask with the wrong query length": (
        lambda: sdpa(q, k, v, attn_mask=torch.ones(3, 5, dtype=torch.bool)), RuntimeError,
        r"attn_mask of shape \[3, 5\] is not broadcastable to the attention weights' shape \[2, 4, 5\]"),
    "heads missing from key": (lambda: sdpa(torch.randn(2, 3, 4, 8), k, v), RuntimeError,
                               r"batch dimensions of query \[2, 3\] and key \[2\] are not broadcastable"),
    "forward operator, feature mismatch": (
        lambda: torch.ops.attnlab._sdpa_forward(q, k[..., :7], v, None, False, None, False),
        RuntimeError, r"key has 7 features per position but query has 8"),
    "backward, grad_output of another shape": (
        lambda: sdpa_backward(grad_output=torch.ones(2, 4, 4)), RuntimeError,
        r"grad_output has shape \[2, 4, 4\], expected \[2, 4, 3\]"),
    "backward, logsumexp of another shape": (
        lambda: sdpa_backward(logsumexp=torch.zeros(2, 2)), RuntimeError,
        r"logsumexp has shape \[2, 2\], expected \[2, 4\]"),
    "backward, logsumexp of another dtype": (
        lambda: sdpa_backward(logsumexp=sdpa_forward_outputs()[1].double()), RuntimeError,
        r"logsumexp has dtype Double, expected Float"),
    "backward, weights of another shape": (
        lambda: torch.ops.attnlab._sdpa_backward(torch.ones(2, 4, 3), q, k, v, None, False, None,
                                                 *sdpa_forward_outputs()[:2], torch.ones(2, 4, 4)),
        RuntimeError, r"weights has shape \[2, 4, 4\], expected \[2, 4, 5\]"),
    "normalizer is not a string": (lambda: sdpa(q, k, v, normalizer=2), TypeError,
                                   r"normalizer must be a string, got int 2"),
    "normalizer misspelt": (lambda: sdpa(q, k, v, normalizer="entmax-1.5"), RuntimeError,
                            r'unknown normalizer "entmax-1.5"; expected one of "softmax", "sparsemax", "entmax15" or "entmax"'),
    "alpha with sparsemax": (lambda: sdpa(q, k, v, normalizer="sparsemax", alpha=2.0), RuntimeError,
                             r'alpha is only taken by normalizer="entmax" .*got alpha=2 with normalizer="sparsemax"'),
    "entmax without alpha": (lambda: sdpa(q, k, v, normalizer="entmax"), RuntimeError,
                             r'normalizer="entmax" needs alpha, a finite number > 1'),
    "entmax alpha below 1": (lambda: sdpa(q, k, v, normalizer="entmax", alpha=0.9), RuntimeError,
                             r"alpha must be a finite number > 1 .*got 0.9"),
    "entmax alpha infinite": (lambda: sdpa(q, k, v, normalizer="entmax", alpha=math.inf),
                              RuntimeError, r"alpha must be a finite number > 1 .*got inf"),
    "sparse forward operator, alpha 1": (
        lambda: torch.ops.attnlab._sparse_sdpa_forward(q, k, v, None, False, None, False, 1.0),
        RuntimeError, r"alpha must be a finite number > 1 .*got 1"),
    "sparse backward, tau of another shape": (
        lambda: sparse_backward(tau=torch.zeros(2, 2)), RuntimeError,
        r"backward: tau has shape \[2, 2\], expected \[2, 4\]"),
    "sparse backward, support_value of another dtype": (
        lambda: sparse_backward(support_value=torch.zeros(2, 4, 3, dtype=torch.float64)),
        RuntimeError, r"backward: support_value has dtype Double, expected Float"),
    "additive, query_proj of rank 2": (lambda: additive(qp[0], kp, w), RuntimeError,
                                       r"query_proj must have 3 dimensions \[batch, length, hidden\], got shape \[3, 4\]"),
    "additive, weight of rank 2": (lambda: additive(qp, kp, w[None]), RuntimeError,
                                   r"weight must have 1 dimension \[hidden\], got shape \[1, 4\]"),
    "additive, integer input": (lambda: additive(qp.long(), kp, w), RuntimeError,
                                r"query_proj must be float32 or float64, got Long"),
    "additive, mixed dtypes": (lambda: additive(qp, kp.double(), w), RuntimeError,
                               r"key_proj has dtype Double but query_proj has Float"),
    "additive, batch mismatch": (lambda: additive(qp, kp[:1], w), RuntimeError,
                                 r"key_proj has batch size 1 but query_proj has 2"),
    "additive, hidden mismatch": (lambda: additive(qp, kp[..., :3], w), RuntimeError,
                                  r"key_proj has hidden size 3 but query_proj has 4"),
    "additive, weight of the wrong size": (lambda: additive(qp, kp, w[:3]), RuntimeError,
                                           r"weight has 3 entries but the hidden size is 4"),
    "additive, inputs on two devices": (lambda: additive(qp, kp.to("meta"), w), RuntimeError,
                                        r"key_proj is on meta but query_proj is on cpu"),
    "additive backward, grad of another shape": (
        lambda: torch.ops.attnlab._additive_scores_backward(torch.ones(2, 3, 4), qp, kp, w),
        RuntimeError, r"grad_scores has shape \[2, 3, 4\], expected \[2, 3, 5\]"),
}

MODULES = {
    "heads do not divide the width": (lambda: attn_nn.MultiheadAttention(8, 15, 2), ValueError,
                                      r"embed_dim \(15\) must be divisible by num_heads \(2\)"),
    "zero input width": (lambda: attn_nn.MultiheadAttention(0, 16, 2), ValueError,
                         r"input_dim must be positive, got 0"),
    "fractional width": (lambda: attn_nn.MultiheadAttention(8.5, 16, 2), TypeError,
                         r"input_dim must be an integer, got 8.5"),
    "input of the wrong width": (lambda: attn_nn.MultiheadAttention(8, 16, 2)(torch.randn(2, 5, 7)),
                                 ValueError, r"expects x of shape \[batch, length, 8\], got \[2, 5, 7\]"),
    "mask of the wrong length": (
        lambda: attn_nn.MultiheadAttention(8, 16, 2)(torch.randn(2, 5, 8), mask=torch.ones(4, 4, dtype=torch.bool)),
        ValueError, r"mask must have shape \[L, L\], \[B, L, L\] or \[B, H, L, L\] with L = 5, got \[4, 4\]"),
    "mask of another batch": (
        lambda: attn_nn.MultiheadAttention(8, 16, 2)(torch.randn(2, 5, 8), mask=torch.ones(3, 5, 5, dtype=torch.bool)),
        ValueError, r"mask has batch size 3 but the input has 2"),
    "dropout probability above 1": (lambda: attn_nn.MultiHeadAttention(12, 3, p=1.5), ValueError,
                                    r"p is a dropout probability and must be in \[0, 1\), got 1.5"),
    "cross attention key of the wrong width": (
        lambda: attn_nn.MultiHeadAttention(12, 3)(torch.randn(2, 4, 12), torch.randn(2, 4, 11), torch.randn(2, 4, 12)),
        ValueError, r"X_k must have shape \[batch, length, 12\], got \[2, 4, 11\]"),
    "unknown normalizer for a module": (
        lambda: attn_nn.MultiheadAttention(8, 16, 2, normalizer="sparse"), ValueError,
        r"unknown normalizer 'sparse'; expected one of 'softmax', 'sparsemax', 'entmax15', 'entmax'"),
    "encoder block, entmax without alpha": (
        lambda: attn_nn.EncoderBlock(8, 2, 16, normalizer="entmax"), ValueError,
        r"normalizer='entmax' needs alpha, a finite number > 1"),
    "encoder, alpha of 1": (
        lambda: attn_nn.TransformerEncoder(1, input_dim=8, num_heads=2, dim_feedforward=16,
                                           normalizer="entmax", alpha=1), ValueError,
        r"alpha must be a finite number > 1 .*got 1"),
    "module, alpha a string": (
        lambda: attn_nn.MultiheadAttention(8, 16, 2, normalizer="entmax", alpha="1.5"), TypeError,
        r"alpha must be a number, got '1.5'"),
    "encoder dropout of 1": (lambda: attn_nn.EncoderBlock(8, 2, 16, dropout=1.0), ValueError,
                             r"dropout must be in \[0, 1\), got 1.0"),
    "sequence-first torch layer": (
        lambda: attn_nn.EncoderBlock.from_torch(torch.nn.TransformerEncoderLayer(8, 2, 16)),
        ValueError, r"only batch_first=True TransformerEncoderLayer"),
    "encoder without layers": (
        lambda: attn_nn.TransformerEncoder(0, input_dim=8, num_heads=2, dim_feedforward=16),
        ValueError, r"num_layers must be positive, got 0"),
    "sequence longer than max_len": (lambda: attn_nn.PositionalEncoding(8, max_len=4)(torch.randn(1, 5, 8)),
                                     ValueError, r"sequence length 5 exceeds max_len 4"),
    "added encoding of another width": (
        lambda: attn_nn.PositionalEncoder(8, add=True)(torch.randn(1, 3, 7)), ValueError,
        r"add=True needs inputs 8 wide \(the encoding's dim\), got 7"),
    "float mask for additive attention": (
        lambda: attn_nn.AdditiveAttention(4, 4, 3).attend(torch.randn(2, 5, 4), torch.randn(2, 3, 4), mask=torch.ones(2, 3, 5)),
        ValueError, r"mask must be boolean \(True = may attend\), got torch.float32"),
    "dot product of unequal widths": (
        lambda: attn_nn.MultiplicativeAttention().attend(torch.randn(2, 5, 4), torch.randn(2, 3, 5)),
        ValueError, r"queries have 5 features but the objects have 4"),
    "schedule without warm-up": (
        lambda: attn_nn.CosineWarmupScheduler(torch.optim.Adam([torch.nn.Parameter(torch.ones(1))]), 0, 10),
        ValueError, r"warmup and max_iters must be positive, got 0, 10"),
    "negative causal mask size": (lambda: attn_nn.autoregressive_mask(-1), ValueError,
                                  r"size must be non-negative, got -1"),
    "torch attention of another size": (
        lambda: attn_nn.load_torch_multihead_attention(attn_nn.MultiheadAttention(8, 8, 2), torch.nn.MultiheadAttention(8, 4)),
        ValueError, r"target has embed_dim 8, num_heads 2, input_dim 8; the source needs 8, 4, 8"),
}

CONFIGS = {
    "zero epochs": (lambda: TrainConfig(epochs=0), ValueError, r"epochs must be at least 1, got 0"),
    "fractional epochs": (lambda: TrainConfig(epochs=2.5), TypeError,
                          r"epochs must be an integer, got 2.5"),
    "NaN learning rate": (lambda: TrainConfig(lr=math.nan), ValueError,
                          r"lr \(finite\), warmup and grad_clip must be positive, got nan"),
    "zero gradient clip": (lambda: TrainConfig(grad_clip=0.0), ValueError,
                           r"grad_clip must be positive, got 0.0005, 50, 0.0"),
    "reverse: training set smaller than a batch": (
        lambda: reverse.ReverseConfig(train_size=100), ValueError,
        r"train_size \(100\) must hold at least one batch of 128"),
    "reverse: batch size 0": (lambda: reverse.ReverseConfig(batch_size=0), ValueError,
                              r"batch_size, num_layers and num_heads must be at least 1, got 0"),
    "reverse: heads do not divide the width": (
        lambda: reverse.ReverseConfig(num_heads=3), ValueError,
        r"model_dim \(32\) must be divisible by num_heads \(3\)"),
    "reverse: one class": (lambda: reverse.ReverseConfig(num_classes=1), ValueError,
                           r"need seq_len >= 1 and num_classes >= 2, got 16, 1"),
    "anomaly: fewer sets than a batch": (
        lambda: anomaly.AnomalyConfig(sets_per_epoch=10), ValueError,
        r"sets_per_epoch \(10\) must hold at least one batch of 64"),
    "anomaly: dropout of 1": (lambda: anomaly.AnomalyConfig(dropout=1.0), ValueError,
                              r"dropout must be in \[0, 1\), got 1.0"),
    "anomaly: heads do not divide the width": (
        lambda: anomaly.AnomalyConfig(num_heads=3), ValueError,
        r"model_dim \(256\) must be divisible by num_heads \(3\)"),
}


@pytest.mark.parametrize("name", [*OPERATORS, *MODULES, *CONFIGS])
def test_bad_argument(name):
    call, error, message = {**OPERATORS, **MODULES, **CONFIGS}[name]
    with pytest.raises(error, match=message):
        call()


# ---- files: data sets and checkpoints ---------------------------------------------------------

def write_idx(path, array, compress=True):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())
    return path


def without(folder, name):
    (folder / name).unlink()
    return folder


def fashion_folder(folder, labels=10):
    """A small folder of the four Fashion-MNIST files (``labels`` classes in the labels)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("t10k", 5)):
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % labels)
    return folder


def a_checkpoint(**fields):
    state = {"task": "reverse", "epoch": 1, "model": {}, "optimizer": {}, "scheduler": {},
             "generator": torch.Generator().get_state(), "rng": {}, "history": [],
             "seconds": 0.0, "train_config": {}}
    return state | fields


def save(obj, path):
    torch.save(obj, path)
    return path


def cut_in_half(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    return path


def idx_bytes(*header, payload=b""):
    return bytes(header) + payload


FILES = {
    "Fashion-MNIST folder missing": (
        lambda tmp: load_fashion_mnist(tmp / "nowhere"), DataError,
        r"Fashion-MNIST not found: .*nowhere is not a folder; pass a folder holding the four"),
    "one Fashion-MNIST file missing": (
        lambda tmp: load_fashion_mnist(without(fashion_folder(tmp), "train-labels-idx1-ubyte.gz")),
        DataError, r"train-labels-idx1-ubyte.gz does not exist"),
    "idx data truncated": (
        lambda tmp: read_idx(save_bytes(tmp / "f", idx_bytes(0, 0, 8, 1, 0, 0, 0, 10, payload=b"abc"))),
        DataError, r"truncated or padded: its header promises 10 values of shape \[10\], the file holds 3"),
    "idx header truncated": (lambda tmp: read_idx(save_bytes(tmp / "f", idx_bytes(0, 0, 8, 3, 0, 0))),
                             DataError, r"truncated idx header"),
    "not an idx file": (lambda tmp: read_idx(save_bytes(tmp / "f", b"PK\x03\x04 a zip file")),
                        DataError, r"is not an idx file \(bad magic number\)"),
    "idx of floats": (lambda tmp: read_idx(save_bytes(tmp / "f", idx_bytes(0, 0, 0x0D, 1, 0, 0, 0, 1, payload=b"\0" * 4))),
                      DataError, r"holds idx type 0x0d; only unsigned bytes \(0x08\) are supported"),
    "corrupt gzip": (lambda tmp: read_idx(save_bytes(tmp / "f.gz", b"\x1f\x8b\x08\x00garbage")),
                     DataError, r"is not a readable idx file"),
    "gzip cut in half": (
        lambda tmp: read_idx(cut_in_half(write_idx(tmp / "f.gz", np.zeros((50, 28, 28))))),
        DataError, r"is not a readable idx file"),
    "label outside the classes": (lambda tmp: load_fashion_mnist(fashion_folder(tmp, labels=12)),
                                  DataError, r"label 11 is not a class"),
    "images and labels of different counts": (
        lambda tmp: load_fashion_mnist(write_idx(fashion_folder(tmp) / "t10k-labels-idx1-ubyte.gz", np.zeros(4)).parent),
        DataError, r"test images \[5, 28, 28\] and labels \[4\] do not match"),
    "not an aclImdb folder": (
        lambda tmp: load_imdb(made_dirs(tmp, "train/pos", "train/neg", "test/pos")), DataError,
        r"is not an aclImdb folder: it lacks the sub-folder\(s\) test/neg"),
    "aclImdb folder missing": (lambda tmp: load_imdb(tmp / "aclImdb"), DataError,
                               r"IMDB corpus not found: .*aclImdb is not a folder; download"),
    "checkpoint cut in half": (
        lambda tmp: load_checkpoint(cut_in_half(save(a_checkpoint(), tmp / "c.pt")), "reverse"),
        CheckpointError, r"cannot read checkpoint .*c.pt"),
    "empty checkpoint": (lambda tmp: load_checkpoint(save_bytes(tmp / "c.pt", b""), "reverse"),
                         CheckpointError, r"cannot read checkpoint .*c.pt"),
    "a tensor saved as checkpoint": (
        lambda tmp: load_checkpoint(save(torch.ones(3), tmp / "c.pt"), "reverse"),
        CheckpointError, r"c.pt is not a checkpoint of the 'reverse' experiment"),
    "another experiment's checkpoint": (
        lambda tmp: load_checkpoint(save(a_checkpoint(task="anomaly"), tmp / "c.pt"), "reverse"),
        CheckpointError, r"c.pt is not a checkpoint of the 'reverse' experiment"),
    "checkpoint without its optimizer": (
        lambda tmp: load_checkpoint(save({k: v for k, v in a_checkpoint().items() if k != "optimizer"}, tmp / "c.pt"), "reverse"),
        CheckpointError, r"c.pt is an incomplete checkpoint: it lacks optimizer"),
    "checkpoint of another configuration": (
        lambda tmp: fit(reverse.make_task(tiny_reverse()), tiny_reverse().train, out_dir=save_checkpoint_dir(tmp), progress=False),
        CheckpointError, r"was written with another configuration .*; use another --out folder"),
    "out_dir is a file": (
        lambda tmp: fit(reverse.make_task(tiny_reverse()), tiny_reverse().train, out_dir=save_bytes(tmp / "f", b""), progress=False),
        NotADirectoryError, r"out_dir .*f is a file; it must be a folder for the checkpoint"),
}


def made_dirs(root, *names):
    for name in names:
        (root / name).mkdir(parents=True)
    return root


def save_bytes(path, data):
    path.write_bytes(data)
    return path


def tiny_reverse():
    return reverse.ReverseConfig(train_size=128, val_size=10, test_size=10,
                                 train=TrainConfig(epochs=1))


def save_checkpoint_dir(tmp):
    save(a_checkpoint(train_config={"epochs": 99}), tmp / "checkpoint.pt")
    return tmp


@pytest.mark.parametrize("name", FILES)
def test_bad_file(name, tmp_path):
    call, error, message = FILES[name]
    with pytest.raises(error, match=message):
        call(tmp_path)


# ---- the command line -------------------------------------------------------------------------

def foreign_checkpoint_folder(tmp):
    save(torch.ones(3), tmp / "checkpoint.pt")
    return str(tmp)


CLI = {
    "unknown command": (lambda tmp: ["train"], 2, r"argument COMMAND: invalid choice: 'train'"),
    "unknown option": (lambda tmp: ["reverse", "--fastest"], 2, r"unrecognized arguments: --fastest"),
    "epochs not a number": (lambda tmp: ["reverse", "--epochs", "ten"], 2,
                            r"argument --epochs: invalid int value: 'ten'"),
    "zero epochs": (lambda tmp: ["reverse", "--epochs", "0"], 2, r"--epochs must be at least 1"),
    "seed not a number": (lambda tmp: ["reverse", "--seed", "1.5"], 2,
                          r"argument --seed: invalid int value: '1.5'"),
    "demo of length 0": (lambda tmp: ["demo", "--length", "0"], 2,
                         r"--length and --dim must be at least 1"),
    "missing Fashion-MNIST folder": (lambda tmp: ["anomaly", "--fast", "--data", str(tmp / "nowhere")], 1,
                                     r"^attnlab anomaly: error: Fashion-MNIST not found: .*nowhere is not a folder"),
    "truncated Fashion-MNIST file": (
        lambda tmp: ["anomaly", "--fast", "--data", str(gzip_truncated_fashion(tmp))], 1,
        r"^attnlab anomaly: error: .*train-images-idx3-ubyte.gz is not a readable idx file"),
    "foreign checkpoint in --out": (lambda tmp: ["reverse", "--fast", "--out", foreign_checkpoint_folder(tmp)], 1,
                                    r"^attnlab reverse: error: .*checkpoint.pt is not a checkpoint of the 'reverse' experiment"),
    "--out is a file": (lambda tmp: ["reverse", "--fast", "--out", str(save_bytes(tmp / "f", b""))], 1,
                        r"^attnlab reverse: error: out_dir .*f is a file; it must be a folder"),
}


def gzip_truncated_fashion(tmp):
    folder = fashion_folder(tmp)
    cut_in_half(folder / "train-images-idx3-ubyte.gz")
    return folder


@pytest.mark.parametrize("name", CLI)
def test_bad_command_line(name, tmp_path, capsys, monkeypatch):
    make_argv, status, message = CLI[name]
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))  # no feature cache is reused
    try:
        code = cli.main(make_argv(tmp_path))
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code
    stderr = capsys.readouterr().err
    assert code == status, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr  # one line, so no traceback either
    assert re.search(message, stderr.strip()), stderr
