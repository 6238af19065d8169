"""The NYU self-attention notebook (Transformer encoder for sentiment classification) under its
own names.

Replace the notebook's definitions with one import and the rest of it runs unchanged:

    from attnlab.tutorials.nyu import (MultiHeadAttention, CNN, EncoderLayer,
        create_sinusoidal_embeddings, Embeddings, Encoder, TransformerClassifier, train,
        evaluate)

``MultiHeadAttention(d_model, num_heads, p, d_input=None)`` is ``attnlab.nn.MultiHeadAttention``
(``W_q``, ``W_k``, ``W_v`` without bias, ``W_h`` with bias) with the notebook's methods:
``scaled_dot_product_attention(Q, K, V) -> (H, A)`` (through attnlab's operator, scale
1/√d_k with d_k = d_model / num_heads, whatever the width of Q), ``split_heads(x,
batch_size)``, ``group_heads(x, batch_size)`` and ``forward(X_q, X_k, X_v) -> (H, A)``;
``forward`` calls those methods, so a subclass that overrides one of them is heard.

**Masks:** the notebook uses none (no padding mask either), and neither does this module.
**Fully masked rows** cannot occur; attnlab would give them zeros.

**Differences that remain:**

- ``create_sinusoidal_embeddings`` fills the table from attnlab's sinusoids (float64, rounded
  to float32); for an odd ``dim`` it uses the next even size's frequencies (the notebook's
  formula divides by the odd ``dim``).
- ``train``/``evaluate`` take the model and optimizer as arguments and, when they are not
  given, read the notebook's globals ``model`` and ``optimizer`` as the notebook's functions do;
  batches may be ``(x, y)`` pairs or torchtext-style objects with ``.text`` and ``.label``.
- The ``p`` (dropout) arguments are kept and, as in the notebook, not used.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .. import nn as _attnlab_nn
from ..functional import scaled_dot_product_attention as _attention
from ..nn import sinusoidal_table
from ._common import check_positive_int, check_tensor, from_notebook

__all__ = [
    "MultiHeadAttention", "CNN", "EncoderLayer", "create_sinusoidal_embeddings", "Embeddings",
    "Encoder", "TransformerClassifier", "train", "evaluate", "key_value_demo",
]


class MultiHeadAttention(_attnlab_nn.MultiHeadAttention):
    """``MultiHeadAttention(d_model, num_heads, p, d_input=None)``: see the module notes. ``p``
    (dropout) is kept and, as in the notebook, not used."""

    def scaled_dot_product_attention(self, Q: torch.Tensor, K: torch.Tensor,
                                     V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """softmax(Q·Kᵀ/√d_k)·V with d_k = d_model / num_heads.

        Args:
            Q: queries ``[..., L_q, E]``.
            K: keys ``[..., L_k, E]``.
            V: values ``[..., L_k, E_v]``.

        Returns:
            The pair ``(H, A)``: H ``[..., L_q, E_v]`` and the weights A ``[..., L_q, L_k]``.
        """
        for name, tensor in (("Q", Q), ("K", K), ("V", V)):
            check_tensor(name, tensor)
        return _attention(Q, K, V, scale=1.0 / math.sqrt(self.d_k), need_weights=True)

    def _check_batch(self, x: torch.Tensor, batch_size) -> None:
        check_tensor("x", x)
        if batch_size is not None and batch_size != x.shape[0]:
            raise ValueError(f"batch_size ({batch_size}) differs from x's first dimension "
                             f"({x.shape[0]})")

    def split_heads(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """``[B, L, d_model]`` → ``[B, num_heads, L, d_k]``."""
        self._check_batch(x, batch_size)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"split_heads expects x [batch, length, {self.d_model}], got "
                             f"{list(x.shape)}")
        return super().split_heads(x)

    def group_heads(self, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """``[B, num_heads, L, d_k]`` → ``[B, L, d_model]``."""
        self._check_batch(x, batch_size)
        if x.dim() != 4 or x.shape[1] != self.num_heads or x.shape[-1] != self.d_k:
            raise ValueError(f"group_heads expects x [batch, {self.num_heads}, length, "
                             f"{self.d_k}], got {list(x.shape)}")
        return super().group_heads(x)

    def forward(self, X_q: torch.Tensor, X_k: torch.Tensor,
                X_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """X_q ``[B, L_q, d_xq]``, X_k ``[B, L_k, d_xk]``, X_v ``[B, L_k, d_xv]``.

        Returns:
            The pair ``(H, A)``: H ``[B, L_q, d_model]`` and A ``[B, num_heads, L_q, L_k]``.
        """
        for name, x, width in (("X_q", X_q, self.d_input[0]), ("X_k", X_k, self.d_input[1]),
                               ("X_v", X_v, self.d_input[2])):
            check_tensor(name, x)
            if x.dim() != 3 or x.shape[-1] != width or x.shape[0] != X_q.shape[0]:
                raise ValueError(f"{name} must have shape [{X_q.shape[0]}, length, {width}], "
                                 f"got {list(x.shape)}")
        if X_k.shape[1] != X_v.shape[1]:
            raise ValueError(f"X_k and X_v must have as many positions, got {X_k.shape[1]} and "
                             f"{X_v.shape[1]}")
        batch_size = X_q.shape[0]
        Q = self.split_heads(self.W_q(X_q), batch_size)
        K = self.split_heads(self.W_k(X_k), batch_size)
        V = self.split_heads(self.W_v(X_v), batch_size)
        H_cat, A = self.scaled_dot_product_attention(Q, K, V)
        return self.W_h(self.group_heads(H_cat, batch_size)), A


class CNN(nn.Module):
    """``CNN(d_model, hidden_dim, p)``, the notebook's position-wise feed-forward network:
    ``k1convL1`` (Linear d_model → hidden_dim), ``activation`` (ReLU), ``k1convL2`` (Linear back
    to d_model). ``p`` is not used."""

    def __init__(self, d_model: int, hidden_dim: int, p: float = 0.1):
        super().__init__()
        self.k1convL1 = nn.Linear(d_model, hidden_dim)
        self.k1convL2 = nn.Linear(hidden_dim, d_model)
        self.activation = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., d_model]`` → ``[..., d_model]``."""
        return self.k1convL2(self.activation(self.k1convL1(x)))


class EncoderLayer(nn.Module):
    """``EncoderLayer(d_model, num_heads, conv_hidden_dim, p=0.1)``, post-norm without dropout:
    ``out1 = layernorm1(x + mha(x, x, x)[0])``, ``out2 = layernorm2(out1 + cnn(out1))`` (eps
    1e-6)."""

    def __init__(self, d_model: int, num_heads: int, conv_hidden_dim: int, p: float = 0.1):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, num_heads, p)
        self.cnn = CNN(d_model, conv_hidden_dim, p)
        self.layernorm1 = nn.LayerNorm(normalized_shape=d_model, eps=1e-6)
        self.layernorm2 = nn.LayerNorm(normalized_shape=d_model, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, L, d_model]`` → ``[B, L, d_model]``."""
        attn_output, _ = self.mha(x, x, x)
        out1 = self.layernorm1(x + attn_output)
        return self.layernorm2(out1 + self.cnn(out1))


def create_sinusoidal_embeddings(nb_p: int, dim: int, E: torch.Tensor) -> torch.Tensor:
    """Fills ``E`` ``[nb_p, dim]`` (e.g. an Embedding's weight) in place with the sinusoids
    E[p, 2i] = sin(p/10000^(2i/dim)), E[p, 2i+1] = cos(p/10000^(2i/dim)) and freezes it
    (``requires_grad = False``), as the notebook does.

    Returns:
        ``E``.
    """
    check_positive_int("nb_p", nb_p)
    check_positive_int("dim", dim)
    check_tensor("E", E)
    if tuple(E.shape) != (nb_p, dim):
        raise ValueError(f"E must have shape [nb_p, dim] = [{nb_p}, {dim}], got {list(E.shape)}")
    with torch.no_grad():
        E.copy_(sinusoidal_table(nb_p, dim))
    E.requires_grad = False
    return E


class Embeddings(nn.Module):
    """``Embeddings(d_model, vocab_size, max_position_embeddings, p)``: ``word_embeddings``
    (padding index 1) plus ``position_embeddings`` (the frozen sinusoids), then ``LayerNorm``
    (eps 1e-12). ``p`` is not used."""

    def __init__(self, d_model: int, vocab_size: int, max_position_embeddings: int,
                 p: float = 0.1):
        super().__init__()
        check_positive_int("vocab_size", vocab_size, 2)
        self.word_embeddings = nn.Embedding(vocab_size, d_model, padding_idx=1)
        self.position_embeddings = nn.Embedding(max_position_embeddings, d_model)
        create_sinusoidal_embeddings(nb_p=max_position_embeddings, dim=d_model,
                                     E=self.position_embeddings.weight)
        self.LayerNorm = nn.LayerNorm(d_model, eps=1e-12)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids ``[B, L]`` (int64) → ``[B, L, d_model]``."""
        check_tensor("input_ids", input_ids)
        if input_ids.dim() != 2 or input_ids.dtype != torch.long:
            raise ValueError(f"input_ids must be an int64 tensor [batch, length], got "
                             f"{input_ids.dtype} of shape {list(input_ids.shape)}")
        if input_ids.shape[1] > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequences of {input_ids.shape[1]} tokens exceed the "
                             f"{self.position_embeddings.num_embeddings} positions")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(embeddings)


class Encoder(nn.Module):
    """``Encoder(num_layers, d_model, num_heads, ff_hidden_dim, input_vocab_size,
    maximum_position_encoding, p=0.1)``: ``embedding`` (Embeddings) then ``enc_layers``."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, ff_hidden_dim: int,
                 input_vocab_size: int, maximum_position_encoding: int, p: float = 0.1):
        super().__init__()
        self.d_model = d_model
        self.num_layers = check_positive_int("num_layers", num_layers)
        self.embedding = Embeddings(d_model, input_vocab_size, maximum_position_encoding, p)
        self.enc_layers = nn.ModuleList(EncoderLayer(d_model, num_heads, ff_hidden_dim, p)
                                        for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """token ids ``[B, L]`` → ``[B, L, d_model]``."""
        x = self.embedding(x)
        for layer in self.enc_layers:
            x = layer(x)
        return x


class TransformerClassifier(nn.Module):
    """``TransformerClassifier(num_layers, d_model, num_heads, conv_hidden_dim,
    input_vocab_size, num_answers)``: ``encoder`` (10,000 positions), max-pool over the
    sequence, ``dense`` (Linear to ``num_answers``)."""

    def __init__(self, num_layers: int, d_model: int, num_heads: int, conv_hidden_dim: int,
                 input_vocab_size: int, num_answers: int):
        super().__init__()
        self.encoder = Encoder(num_layers, d_model, num_heads, ff_hidden_dim=conv_hidden_dim,
                               input_vocab_size=input_vocab_size,
                               maximum_position_encoding=10000, p=0.1)
        self.dense = nn.Linear(d_model, num_answers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """token ids ``[B, L]`` → logits ``[B, num_answers]``."""
        x, _ = torch.max(self.encoder(x), dim=1)
        return self.dense(x)


def _batch(batch, device):
    if hasattr(batch, "text") and hasattr(batch, "label"):
        return batch.text.to(device), batch.label.to(device)
    x, y = batch
    return x.to(device), y.to(device)


def _device_of(model: nn.Module):
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def evaluate(data_loader, model: nn.Module | None = None) -> float:
    """The accuracy of ``model`` (default: the notebook's global ``model``) over ``data_loader``
    (mean of the per-batch accuracies, as the notebook computes it); printed and returned."""
    model = from_notebook("model", model, "evaluate")
    device = _device_of(model)
    model.eval()
    accuracies = []
    with torch.no_grad():
        for batch in data_loader:
            x, y = _batch(batch, device)
            accuracies.append((model(x).argmax(1) == y).float().mean().item())
    if not accuracies:
        raise ValueError("evaluate: data_loader yielded no batches")
    accuracy = float(np.mean(accuracies))
    print(f"Eval accuracy: {accuracy}")
    return accuracy


def train(train_loader, valid_loader, model: nn.Module | None = None, optimizer=None,
          epochs: int | None = None, loss_fn=F.cross_entropy) -> list[dict]:
    """The notebook's training loop: ``epochs`` passes over ``train_loader`` (cross-entropy,
    ``optimizer`` steps), printing the mean training loss and accuracy of each epoch, then
    evaluating on ``valid_loader``. ``model``, ``optimizer`` and ``epochs`` default to the
    notebook's globals of those names, as the notebook's loop reads them.

    Returns:
        One dict per epoch: ``train_loss``, ``train_acc``, ``valid_acc``.
    """
    model = from_notebook("model", model, "train")
    optimizer = from_notebook("optimizer", optimizer, "train")
    epochs = check_positive_int("epochs", from_notebook("epochs", epochs, "train"))
    device = _device_of(model)
    history = []
    for epoch in range(epochs):
        model.train()
        losses, accuracies = [], []
        for batch in train_loader:
            x, y = _batch(batch, device)
            out = model(x)
            loss = loss_fn(out, y)
            model.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            accuracies.append((out.argmax(1) == y).float().mean().item())
        if not losses:
            raise ValueError("train: train_loader yielded no batches")
        print(f"Training loss at epoch {epoch} is {np.mean(losses)}")
        print(f"Training accuracy: {np.mean(accuracies)}")
        print("Evaluating on validation:")
        history.append({"train_loss": float(np.mean(losses)),
                        "train_acc": float(np.mean(accuracies)),
                        "valid_acc": evaluate(valid_loader, model)})
    return history


def key_value_demo() -> dict:
    """The notebook's key–value lookup through ``MultiHeadAttention(d_model=512, num_heads=8,
    p=0)``'s own ``scaled_dot_product_attention`` (scale 1/√64 = 1/8): keys
    K = [[10,0,0],[0,10,0],[0,0,10],[0,0,10]] and values V = [[1,0,0],[10,0,0],[100,5,0],
    [1000,6,0]] as ``[1, 1, 4, 3]``; the query [0,10,0] matches the second key and returns
    ≈ V's second row, [0,0,10] matches the last two equally and returns their mean, and the
    three queries [0,0,10], [0,10,0], [10,10,0] are looked up at once.

    Returns:
        A dict with ``K``, ``V`` and, for each of ``"one_key"``, ``"two_keys"`` and ``"three"``,
            the triple ``(Q, H, A)``.
    """
    temp_mha = MultiHeadAttention(d_model=512, num_heads=8, p=0)
    K = torch.tensor([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]]).float()[None, None]
    V = torch.tensor([[1, 0, 0], [10, 0, 0], [100, 5, 0], [1000, 6, 0]]).float()[None, None]
    result = {"K": K, "V": V}
    for name, queries in (("one_key", [[0, 10, 0]]), ("two_keys", [[0, 0, 10]]),
                          ("three", [[0, 0, 10], [0, 10, 0], [10, 10, 0]])):
        Q = torch.tensor(queries).float()[None, None]
        H, A = temp_mha.scaled_dot_product_attention(Q, K, V)
        result[name] = (Q, H, A)
    return result
