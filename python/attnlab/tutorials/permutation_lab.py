"""The permutation-composition attention lab under its own names.

Replace the lab's definitions with one import and the rest of the notebook runs unchanged:

    from attnlab.tutorials.permutation_lab import (perm_generator, get_autoregressive_mask,
        AdditiveAttention, MultiplicativeAttention, ScaledDotProductAttention,
        PositionalEncoder, PermMultiplier, train_perm_multiplier, check_model)

The attention layers are ``attnlab.nn``'s (the scores through attnlab's operators) behind the
lab's interface: ``get_scores(features, queries)`` ``[B, Q, K]``, ``attend(features, queries,
mask=None)`` ``[B, Q, F]`` (the features are keys and values), ``last_weights`` the detached
weights of the last ``attend``.

**Mask convention (the lab's):** boolean, ``True`` = the query may **not** attend to that
object; ``get_autoregressive_mask(size)`` is True above the diagonal (query i sees objects
j <= i). The layers of this module convert at their boundary (``~mask``); ``attnlab.nn``'s own
layers read True as "may attend", so a lab mask given to them is silently inverted.

**Differences that remain:**

- A query whose objects are all masked gets a zero output and zero weights; the lab's
  softmax over scores that are all -inf gives NaN.
- ``last_weights`` is a detached copy of the last weights.
- The lab does not fix the class names of its attention layers, nor the name of its training
  loop; the names here are ``AdditiveAttention(obj_feature_dim, query_feature_dim,
  hidden_dim)``, ``MultiplicativeAttention()``, ``ScaledDotProductAttention()`` (also
  ``ScaledDotAttention``), ``train_perm_multiplier`` and ``check_model``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn

from .. import nn as _attnlab_nn
from .. import plot as _plot
from ..nn import PositionalEncoder
from ..tasks.permutation import permutation_batch as _permutation_batch
from ._common import check_positive_int, check_tensor, show_or_return

__all__ = [
    "perm_generator", "get_autoregressive_mask", "to_attnlab_mask", "AdditiveAttention",
    "MultiplicativeAttention", "ScaledDotProductAttention", "ScaledDotAttention",
    "PositionalEncoder", "PermMultiplier", "train_perm_multiplier", "perm_accuracy",
    "check_model", "plot_positional_encoder", "plot_attention_map",
]


def perm_generator(batch_size: int, perm_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fresh batch (torch's global generator): inputs = two random permutations p₁, p₂ of
    0..perm_size−1 side by side, targets = perm_size zeros followed by p₃[i] = p₁[p₂[i]].

    Returns:
        The pair ``(inputs, targets)``, both ``[batch_size, 2·perm_size]`` int64.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("perm_size", perm_size)
    return _permutation_batch(batch_size, perm_size)


def get_autoregressive_mask(size: int, device=None) -> torch.Tensor:
    """``[size, size]`` boolean mask in the lab's convention: True where query i may *not*
    attend, i.e. above the diagonal (objects j > i)."""
    check_positive_int("size", size, 0)
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(diagonal=1)


def to_attnlab_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The lab's mask (True = blocked) as attnlab's (True = may attend): ``~mask``."""
    if mask is None:
        return None
    check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be boolean (True = the query may not attend there), got "
                        f"{mask.dtype}")
    return ~mask


class _LabMasks:
    """The lab's mask convention for an attnlab.nn attention layer (mixed in before it)."""

    @staticmethod
    def get_autoregressive_mask(size: int, device=None) -> torch.Tensor:
        """The lab's autoregressive mask (True above the diagonal = blocked)."""
        return get_autoregressive_mask(size, device)

    def attend(self, features: torch.Tensor, queries: torch.Tensor,
               mask: torch.Tensor | None = None) -> torch.Tensor:
        """features ``[B, K, F]`` (keys and values), queries ``[B, Q, Fq]`` → ``[B, Q, F]``, each
        query's weighted mean of the features; ``mask`` (True = blocked) broadcasts to
        ``[B, Q, K]``. The weights are kept in ``last_weights``."""
        return super().attend(features, queries, to_attnlab_mask(mask))


class AdditiveAttention(_LabMasks, _attnlab_nn.AdditiveAttention):
    """Bahdanau's scores w₃ᵀ tanh(W₁q + W₂k) (``W1``, ``W2``, ``w3``, no biases), queries and
    objects of different widths: ``AdditiveAttention(obj_feature_dim, query_feature_dim,
    hidden_dim)``. Masks in the lab's convention (True = blocked)."""


class MultiplicativeAttention(_LabMasks, _attnlab_nn.MultiplicativeAttention):
    """Luong's scores qᵀk (queries as wide as the objects). Masks in the lab's convention
    (True = blocked)."""


class ScaledDotProductAttention(_LabMasks, _attnlab_nn.ScaledDotProductAttention):
    """Scores qᵀk/√d (queries as wide as the objects). Masks in the lab's convention
    (True = blocked)."""


ScaledDotAttention = ScaledDotProductAttention
"""Another name for ``ScaledDotProductAttention``."""


class PermMultiplier(nn.Module):
    """``PermMultiplier(perm_len, embedding_dim, hidden_dim, attention, pos_enc, autoregressive)``:
    ``embedding`` (perm_len digits → embedding_dim), then ``pos_enc`` (a ``PositionalEncoder``,
    added or concatenated, or None), an ``lstm`` whose ``hidden_dim``-wide outputs are the
    queries, the ``attention`` object (an attention layer of this module) over the embedded
    sequence (the objects, with the lab's autoregressive mask when ``autoregressive``), and
    ``output``: Linear to ``perm_len`` logits per position.

    A dot-product attention needs ``hidden_dim`` equal to the objects' width (embedding_dim,
    plus the encoder's ``extra_output_shape`` when it concatenates)."""

    def __init__(self, perm_len: int, embedding_dim: int, hidden_dim: int, attention: nn.Module,
                 pos_enc: PositionalEncoder | None, autoregressive: bool):
        super().__init__()
        self.perm_len = check_positive_int("perm_len", perm_len, 2)
        check_positive_int("embedding_dim", embedding_dim)
        check_positive_int("hidden_dim", hidden_dim)
        if not callable(getattr(attention, "attend", None)):
            raise TypeError(f"attention must be an attention layer with attend(features, "
                            f"queries, mask), got {type(attention).__name__}")
        if (isinstance(attention, _attnlab_nn.AttentionLayer)
                and not isinstance(attention, _LabMasks)):
            raise TypeError(f"attention is attnlab.nn.{type(attention).__name__}, whose masks "
                            f"mean True = may attend; PermMultiplier passes the lab's masks "
                            f"(True = blocked): use attnlab.tutorials.permutation_lab."
                            f"{type(attention).__name__}")
        if pos_enc is not None and not hasattr(pos_enc, "extra_output_shape"):
            raise TypeError(f"pos_enc must be a PositionalEncoder or None, got "
                            f"{type(pos_enc).__name__}")
        width = embedding_dim + (pos_enc.extra_output_shape if pos_enc is not None else 0)
        if (isinstance(attention, _attnlab_nn.ScaledDotProductAttention)
                and hidden_dim != width):
            raise ValueError(f"hidden_dim ({hidden_dim}) must equal the objects' width "
                             f"({width}) for {type(attention).__name__}, whose scores are dot "
                             f"products of queries and objects")
        self.embedding_dim, self.hidden_dim = embedding_dim, hidden_dim
        self.autoregressive = bool(autoregressive)
        self.embedding = nn.Embedding(perm_len, embedding_dim)
        self.pos_enc = pos_enc
        self.lstm = nn.LSTM(width, hidden_dim, batch_first=True)
        self.attention = attention
        self.output = nn.Linear(width, perm_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: digits ``[B, L]`` (int64 in [0, perm_len)) → logits ``[B, L, perm_len]``."""
        check_tensor("x", x)
        if x.dim() != 2 or x.dtype != torch.long:
            raise ValueError(f"x must be an int64 tensor [batch, length], got {x.dtype} of shape "
                             f"{list(x.shape)}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.perm_len):
            raise ValueError(f"x must hold digits in [0, {self.perm_len}), got values from "
                             f"{int(x.min())} to {int(x.max())}")
        objects = self.embedding(x)
        if self.pos_enc is not None:
            objects = self.pos_enc(objects)
        queries, _ = self.lstm(objects)
        mask = get_autoregressive_mask(x.shape[1], x.device) if self.autoregressive else None
        return self.output(self.attention.attend(objects, queries, mask))


def _target_loss(model: PermMultiplier, inputs: torch.Tensor, targets: torch.Tensor):
    n = inputs.shape[1] // 2
    logits = model(inputs)
    return F.cross_entropy(logits[:, n:].reshape(-1, logits.shape[-1]),
                           targets[:, n:].reshape(-1)), logits


def train_perm_multiplier(model: PermMultiplier, num_steps: int, batch_size: int = 64,
                          lr: float = 1e-3, optimizer=None) -> list[float]:
    """Adam (or ``optimizer``) on fresh ``perm_generator`` batches, the cross-entropy on the
    target half (positions n .. 2n−1), for ``num_steps`` steps.

    Returns:
        The training loss of every step.
    """
    check_positive_int("num_steps", num_steps)
    check_positive_int("batch_size", batch_size)
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    model.train()
    for _ in range(num_steps):
        inputs, targets = perm_generator(batch_size, model.perm_len)
        loss, _ = _target_loss(model, inputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def perm_accuracy(model: PermMultiplier, batch_size: int = 1000) -> float:
    """The fraction of the target digits p₃[i] the model gets right on a fresh batch."""
    model.eval()
    inputs, targets = perm_generator(batch_size, model.perm_len)
    n = model.perm_len
    return (model(inputs)[:, n:].argmax(-1) == targets[:, n:]).float().mean().item()


@torch.no_grad()
def check_model(model: PermMultiplier, num_sequences: int = 5) -> None:
    """Prints, for ``num_sequences`` fresh sequences, the input, the model's output on the
    target half and the correct output."""
    model.eval()
    inputs, targets = perm_generator(num_sequences, model.perm_len)
    n = model.perm_len
    predicted = model(inputs)[:, n:].argmax(-1)
    for row in range(num_sequences):
        print(f"input {inputs[row].tolist()}  model {predicted[row].tolist()}  "
              f"correct {targets[row, n:].tolist()}")


def plot_positional_encoder(pos_enc: PositionalEncoder, dims=(1, 2, 3, 4),
                            show: bool = True) -> Figure | None:
    """The encoder's table ``[max_len, dim]`` as a heat map and the curves of ``dims``
    (1-based).

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    return show_or_return(_plot.positional_encoding(pos_enc.pe.cpu(), dims), show)


@torch.no_grad()
def plot_attention_map(model: PermMultiplier, sequence: torch.Tensor,
                       show: bool = True) -> Figure | None:
    """The model's attention weights for one ``sequence`` ``[2n]``, the cells (n + i, p₂[i]) —
    where p₃[i] = p₁[p₂[i]] is read — framed.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    check_tensor("sequence", sequence)
    if sequence.dim() != 1 or sequence.shape[0] % 2:
        raise ValueError(f"sequence must be one input [2n], got {list(sequence.shape)}")
    model.eval()
    model(sequence.unsqueeze(0))
    n = sequence.shape[0] // 2
    tokens = [str(d) for d in sequence.tolist()]
    cells = [(n + i, int(sequence[n + i])) for i in range(n)]
    fig = _plot.attention_map(model.attention.last_weights[0], tokens, tokens, marked=cells,
                              title="framed: (n + i, p₂[i]), where p₃[i] = p₁[p₂[i]] is read")
    return show_or_return(fig, show)
