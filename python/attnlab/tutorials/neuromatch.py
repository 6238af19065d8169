"""Neuromatch (NeuroAI) W1D5 Tutorial 3 "Attention" under its own names.

Replace the tutorial's definitions with one import and the rest of the notebook runs unchanged:

    from attnlab.tutorials.neuromatch import (BinaryMLP, SelfAttention, PositionalEncoding,
        ScaledDotProductAttention, test_sdpa, s_Sparse_AND, s_Sparse_AND_Query, make_train,
        results_dict, gained_dot_product_attention, plot_samples, plot_attention_graph, ...)

The attention itself (the softmax weights and their weighted sum) runs through attnlab's
operator; the models keep the tutorial's attribute names (``tokenizer``, ``positioner``,
``Wq``, ``Wk``, ``Wv``, ``linear``), so its plotting code and state dicts work as they are.

**Masks:** the tutorial uses none. **Fully masked rows** cannot occur here; attnlab would give
them zeros (the tutorial's plain softmax would give NaN).

**Differences that remain:**

- ``SelfAttention(x, elaborate=True)`` returns ``(logits, scores, attention, output)`` as the
  tutorial does; ``scores`` are the softmax weights,
  ``logits``, ``attention`` and ``output`` are differentiable.
- ``test_sdpa`` compares your class with ours within float32 rounding (``torch.allclose``,
  rtol 1e-5, atol 1e-6), not bit for bit: the two compute the softmax differently. It prints
  its verdict as the tutorial's does and also returns it (True/False).
- The data generators return their last draw when no draw falls inside the label window in
  100 tries, as the tutorial's do (for ``s_Sparse_AND_Query(17, 4)`` this always happens: about
  25 % positives), but they also emit a ``UserWarning`` saying so.
- The plotting helpers draw with plain matplotlib (no xkcd style); with ``show=False`` they
  return the Figure instead of displaying it.
"""

from __future__ import annotations

import math
import random
import warnings
from collections import OrderedDict

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .. import plot as _plot
from ..functional import scaled_dot_product_attention as _attention
from ..nn import sinusoidal_table
from ..tasks.sparse_and import gain_inputs as _gain_inputs
from ._common import check_positive_int, check_tensor, show_or_return

__all__ = [
    "BinaryMLP", "SelfAttention", "PositionalEncoding", "ScaledDotProductAttention",
    "SDPA_Solution", "test_sdpa", "s_Sparse_AND", "s_Sparse_AND_Query", "bin_acc",
    "get_n_parameters", "save_model", "load_model", "Trainer", "make_train", "results_dict",
    "set_seed", "set_device", "gained_dot_product_attention",
    "gained_dot_product_attention_implemented", "plot_loss_accuracy", "plot_samples",
    "plot_attention_weights", "plot_attention_weights_stats", "plot_compare",
    "plot_weights_and_output", "plot_attention_graph",
]

MAX_TRIES = 100


# ---- models ------------------------------------------------------------------------------------

class BinaryMLP(torch.nn.Module):
    """``BinaryMLP(in_dims, h_dims: list, out_dims, dropout=0.1)``: for each entry of ``h_dims`` a
    Linear (weights N(0, 0.02), zero bias) → GELU → Dropout, then Linear(h_dims[-1], out_dims)
    (PyTorch's default initialisation, as in the tutorial) → sigmoid. The layers are in
    ``layers``. Integer or boolean inputs are read as floats."""

    def __init__(self, in_dims: int, h_dims: list, out_dims: int, dropout: float = 0.1):
        super().__init__()
        check_positive_int("in_dims", in_dims)
        check_positive_int("out_dims", out_dims)
        if not isinstance(h_dims, (list, tuple)) or len(h_dims) == 0:
            raise ValueError(f"h_dims must be a non-empty list of hidden sizes, got {h_dims!r}")
        for size in h_dims:
            check_positive_int("each entry of h_dims", size)
        self.in_dims, self.h_dims, self.out_dims = in_dims, h_dims, out_dims
        self.layers = torch.nn.ModuleList()
        for width_in, width_out in zip([in_dims] + list(h_dims[:-1]), h_dims):
            linear = torch.nn.Linear(width_in, width_out)
            torch.nn.init.normal_(linear.weight, std=0.02)
            torch.nn.init.zeros_(linear.bias)
            self.layers.extend([linear, torch.nn.GELU(), torch.nn.Dropout(dropout)])
        self.layers.extend([torch.nn.Linear(h_dims[-1], out_dims), torch.nn.Sigmoid()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, in_dims]`` → probabilities ``[B, out_dims]``."""
        check_tensor("x", x)
        if x.shape[-1] != self.in_dims:
            raise ValueError(f"BinaryMLP expects x of shape [batch, {self.in_dims}], got "
                             f"{list(x.shape)}")
        if not x.is_floating_point():
            x = x.float()
        for layer in self.layers:
            x = layer(x)
        return x


def _check_tokens(x, T: int, model: str) -> None:
    check_tensor("x", x)
    if x.dim() != 2 or x.shape[1] != T:
        raise ValueError(f"{model} expects x of shape [batch, {T}] (one token per position), "
                         f"got {list(x.shape)}")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"{model} expects integer tokens (0 or 1, as s_Sparse_AND.generate "
                         f"returns them), got dtype {x.dtype}")
    if x.numel() and (int(x.min()) < 0 or int(x.max()) > 1):
        raise ValueError(f"{model} expects tokens 0 or 1, got values in "
                         f"[{int(x.min())}, {int(x.max())}]")


class SelfAttention(torch.nn.Module):
    """``SelfAttention(T, d)``, the tutorial's binary self-attention model: token embedding
    ``tokenizer`` (2 symbols → d) plus a learned position ``positioner`` [1, T, d]; ``Wq``,
    ``Wk``: d → d and ``Wv``: d → 1 without biases; the attention output [B, T] is read out by
    ``linear`` (Linear(T, 1), no bias) and a sigmoid. Every weight N(0, 0.001): 65 parameters
    at T = 17, d = 2."""

    def __init__(self, T: int, d: int):
        super().__init__()
        self.T = check_positive_int("T", T)
        self.d = check_positive_int("d", d)
        self.scale = self.d ** -0.5
        self.v = 2  # the vocabulary: 0 and 1
        init_std = 0.001
        self.tokenizer = torch.nn.Embedding(self.v, self.d)
        # Drawn uniformly and then re-drawn below, as the tutorial does: the first draw moves
        # the generator, so every later draw under a seed matches the tutorial's.
        self.positioner = torch.nn.Parameter(torch.rand(1, self.T, self.d))
        self.Wq = torch.nn.Linear(self.d, self.d, bias=False)
        self.Wk = torch.nn.Linear(self.d, self.d, bias=False)
        self.Wv = torch.nn.Linear(self.d, 1, bias=False)
        self.linear = torch.nn.Linear(self.T, 1, bias=False)
        for parameter in (self.linear.weight, self.tokenizer.weight, self.positioner,
                          self.Wq.weight, self.Wk.weight, self.Wv.weight):
            torch.nn.init.normal_(parameter, std=init_std)

    def forward(self, x: torch.Tensor, elaborate: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: tokens ``[B, T]`` (int64, 0 or 1).

        Returns:
            ``output`` ``[B, 1]`` = sigmoid(linear(attention)); with ``elaborate`` the tuple
                ``(logits, scores, attention, output)``: logits = Q·Kᵀ/√d ``[B, T, T]`` before the
                softmax, scores = the softmax weights ``[B, T, T]``, attention =
                scores·V ``[B, T]``, output.
        """
        _check_tokens(x, self.T, "SelfAttention")
        h = self.tokenizer(x) + self.positioner
        Q, K, V = self.Wq(h), self.Wk(h), self.Wv(h)
        attention, scores = _attention(Q, K, V, scale=self.scale, need_weights=True)
        attention = attention.squeeze(-1)
        output = torch.sigmoid(self.linear(attention))
        if not elaborate:
            return output
        # The pre-softmax scores the tutorial returns (the operator does not keep them).
        logits = torch.matmul(Q, K.transpose(-2, -1)) * self.scale
        return logits, scores, attention, output


class PositionalEncoding(torch.nn.Module):
    """``PositionalEncoding(T, d_model)``: the fixed sinusoidal table ``pe`` [T, d_model]
    (PE[t, 2i] = sin(t/10000^(2i/d)), PE[t, 2i+1] = cos(...)), an odd size computed at the next
    even size and cropped; ``forward()`` returns it."""

    def __init__(self, T: int, d_model: int):
        super().__init__()
        check_positive_int("T", T)
        check_positive_int("d_model", d_model)
        self.register_buffer("pe", sinusoidal_table(T, d_model))

    def forward(self) -> torch.Tensor:
        """The table ``[T, d_model]``."""
        return self.pe


class ScaledDotProductAttention(torch.nn.Module):
    """The bonus exercise, solved: ``ScaledDotProductAttention(T, dm, dk)`` for one unbatched
    sequence x ``[T, dm]``: ``position`` (fixed PositionalEncoding(T, dm)) added to x, then
    ``Wq``, ``Wk``: dm → dk and ``Wv``: dm → dm without biases, and softmax(Q·Kᵀ/√dk)·V
    ``[T, dm]`` through attnlab's operator."""

    def __init__(self, T: int, dm: int, dk: int):
        super().__init__()
        self.T = check_positive_int("T", T)
        self.dm = check_positive_int("dm", dm)
        self.dk = check_positive_int("dk", dk)
        self.scale = 1.0 / math.sqrt(dk)
        self.position = PositionalEncoding(T, dm)
        self.Wq = torch.nn.Linear(dm, dk, bias=False)
        self.Wk = torch.nn.Linear(dm, dk, bias=False)
        self.Wv = torch.nn.Linear(dm, dm, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[T, dm]`` → ``[T, dm]``."""
        check_tensor("x", x)
        if tuple(x.shape) != (self.T, self.dm):
            raise ValueError(f"ScaledDotProductAttention expects x of shape [T, dm] = "
                             f"[{self.T}, {self.dm}], got {list(x.shape)}")
        x = x + self.position()
        output, _ = _attention(self.Wq(x), self.Wk(x), self.Wv(x), scale=self.scale)
        return output


SDPA_Solution = ScaledDotProductAttention
"""The tutorial's name for the solution ``test_sdpa`` compares with."""


def test_sdpa(your_implementation) -> bool:
    """The tutorial's check of a learner's ``ScaledDotProductAttention`` class: both models built
    with T = 7, dm = 5, dk = 3, yours given our ``Wq``, ``Wk`` and ``Wv``, run on the same random
    input ``[7, 5]``; the outputs must agree (within float32 rounding, see the module notes).

    Returns:
        True when they agree (a message is printed either way).
    """
    context_len, model_dim, key_dim = 7, 5, 3
    toy_x = torch.rand(context_len, model_dim)
    your_model = your_implementation(context_len, model_dim, key_dim)
    our_model = SDPA_Solution(context_len, model_dim, key_dim)
    your_model.Wq, your_model.Wk, your_model.Wv = our_model.Wq, our_model.Wk, our_model.Wv
    with torch.no_grad():
        yours, ours = your_model(toy_x.clone()), our_model(toy_x.clone())
    same = (isinstance(yours, torch.Tensor) and yours.shape == ours.shape
            and torch.allclose(yours.float(), ours, rtol=1e-5, atol=1e-6))
    print("Well done: your implementation matches ours." if same else
          "Not yet: the two implementations should give the same output.")
    return bool(same)


test_sdpa.__test__ = False  # a tutorial helper, not a pytest test, when a test module imports it


# ---- data --------------------------------------------------------------------------------------

def _out_of_window(kind: str, m: int, mean: float, window) -> None:
    warnings.warn(f"{kind}.generate({m}): no draw in {MAX_TRIES} tries met the conditions "
                  f"(label mean in [{window[0]}, {window[1]}]); returning the last draw, whose "
                  f"label mean is {mean:.3f}, as the tutorial does", UserWarning, stacklevel=3)


class s_Sparse_AND:  # noqa: N801  (the tutorial's name)
    """``s_Sparse_AND(T, s)``: T bits, each 1 with probability p = 0.5^(1/3); the label is 1 iff
    the bits at the ``s`` target indices ``f_i`` (drawn among all T positions with Python's
    ``random`` at the first ``generate``, or by ``pick_an_f()``) are all 1.

    ``generate(m)`` redraws up to 100 times until the label mean lies in [0.4, 0.6] and no other
    column equals a target column, and returns the last draw otherwise (with a warning)."""

    def __init__(self, T: int, s: int):
        self.T = check_positive_int("T", T)
        self.s = check_positive_int("s", s)
        if s > T:
            raise ValueError(f"s (the number of targets) must not exceed T = {T}, got {s}")
        self.p = 0.5 ** (1.0 / 3.0)
        self.f_i = None

    def pick_an_f(self) -> None:
        """Draws the target indices ``f_i`` (sorted) and the other indices ``others``."""
        self.f_i = sorted(random.sample(range(self.T), self.s))
        self.others = [i for i in range(self.T) if i not in self.f_i]

    def _has_twin(self, X: torch.Tensor) -> bool:
        """Whether some non-target column equals a target column in every sample."""
        targets, others = X[:, self.f_i], X[:, self.others]
        return bool((targets.unsqueeze(2) == others.unsqueeze(1)).all(dim=0).any())

    def generate(self, m: int, verbose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` samples.

        Returns:
            The pair ``(X, y)``: X ``[m, T]`` int64 bits, y ``[m, 1]`` float labels.
        """
        check_positive_int("m", m)
        if self.f_i is None:
            self.pick_an_f()
        for _ in range(MAX_TRIES):
            X = (torch.rand(m, self.T) < self.p).float()
            y = (X[:, self.f_i].sum(dim=1, keepdim=True) == self.s).float()
            mean = y.mean().item()
            if not 0.4 <= mean <= 0.6:
                if verbose:
                    print(f"label mean {mean:.3f} outside [0.4, 0.6], drawing again")
                continue
            if self._has_twin(X):
                if verbose:
                    print("another column equals a target column, drawing again")
                continue
            if verbose:
                print(f"label mean {mean:.3f}")
            break
        else:
            if verbose:
                print(f"no suitable draw in {MAX_TRIES} tries; keeping the last one")
            _out_of_window("s_Sparse_AND", m, mean, (0.4, 0.6))
        return X.long(), y


class s_Sparse_AND_Query:  # noqa: N801  (the tutorial's name)
    """``s_Sparse_AND_Query(T, s)``, the rule-token task: T − 1 bits (1 with probability
    p = 0.5^(1/2)) followed by a rule bit z; two disjoint target sets ``f_i_1`` and ``f_i_2``
    of size s (drawn with Python's ``random``); the label is 1 iff (z = 0 and the f_i_1 bits
    are all 1) or (z = 1 and the f_i_2 bits are all 1). As in the tutorial ``self.T`` is the
    number of bits before the rule token (T − 1).

    ``generate(m)`` draws the rule bits once, then redraws the bits up to 100 times until the
    label mean lies in [0.45, 0.55], and returns the last draw otherwise (with a warning): for
    s = 4, p⁴ = 0.25 never does."""

    def __init__(self, T: int, s: int):
        check_positive_int("T", T, 2)
        self.s = check_positive_int("s", s)
        if 2 * s > T - 1:
            raise ValueError(f"two disjoint target sets of s = {s} need T - 1 >= {2 * s} bits, "
                             f"got T = {T}")
        self.T = T - 1
        self.k = 1  # one rule token
        self.p = 0.5 ** (1.0 / 2.0)
        self.f_i_1, self.f_i_2, self.f_i = None, None, None

    def pick_an_f(self) -> None:
        """Draws the two disjoint target sets ``f_i_1``, ``f_i_2`` (``f_i`` = both)."""
        self.f_i_1 = sorted(random.sample(range(self.T), self.s))
        self.others_1 = [i for i in range(self.T) if i not in self.f_i_1]
        self.f_i_2 = sorted(random.sample(self.others_1, self.s))
        self.others_2 = [i for i in self.others_1 if i not in self.f_i_2]
        self.f_i = self.f_i_1 + self.f_i_2

    def __call__(self) -> None:
        """Draws new target sets."""
        self.pick_an_f()

    def generate(self, m: int, verbose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` samples.

        Returns:
            The pair ``(X, y)``: X ``[m, T]`` int64 (the bits, then the rule bit), y ``[m, 1]``
                float labels.
        """
        check_positive_int("m", m)
        z = torch.randint(0, 2, (m, self.k))
        if self.f_i_1 is None or self.f_i_2 is None:
            self.pick_an_f()
        rule = z[:, 0] == 1
        for _ in range(MAX_TRIES):
            X = (torch.rand(m, self.T) < self.p).float()
            first = X[:, self.f_i_1].sum(dim=1) == self.s
            second = X[:, self.f_i_2].sum(dim=1) == self.s
            y = torch.where(rule, second, first).float().unsqueeze(1)
            mean = y.mean().item()
            if 0.45 <= mean <= 0.55:
                if verbose:
                    print(f"label mean {mean:.3f}")
                break
            if verbose:
                print(f"label mean {mean:.3f} outside [0.45, 0.55], drawing again")
        else:
            if verbose:
                print(f"no suitable draw in {MAX_TRIES} tries; keeping the last one")
            _out_of_window("s_Sparse_AND_Query", m, mean, (0.45, 0.55))
        return torch.cat([X, z.float()], dim=1).long(), y


# ---- training ----------------------------------------------------------------------------------

def bin_acc(y_hat: torch.Tensor, y: torch.Tensor) -> float:
    """The fraction of ``y_hat`` (probabilities) that round to ``y`` (0 or 1)."""
    if y_hat.numel() != y.numel():
        raise ValueError(f"y_hat and y must hold as many values, got {y_hat.numel()} and "
                         f"{y.numel()}")
    return (y_hat.round().reshape(y.shape) == y).float().mean().item()


def get_n_parameters(model: torch.nn.Module) -> int:
    """The number of learnable parameters of ``model``."""
    return sum(parameter.numel() for parameter in model.parameters())


def save_model(model: torch.nn.Module, path: str = "model_states.pt") -> None:
    """Saves ``model``'s state dict (to ``model_states.pt`` by default, as the tutorial)."""
    torch.save(model.state_dict(), path)


def load_model(model: torch.nn.Module, path: str = "model_states.pt") -> None:
    """Loads the state dict saved by ``save_model`` into ``model``."""
    model.load_state_dict(torch.load(path, weights_only=True))


class Trainer:
    """``Trainer(model, optimizer, criterion)``: full-batch training (``do_train``) and
    evaluation (``do_eval``) on the probabilities the model returns."""

    def __init__(self, model: torch.nn.Module, optimizer, criterion):
        self.model, self.optimizer, self.criterion = model, optimizer, criterion

    def do_eval(self, X_v: torch.Tensor, y_v: torch.Tensor, device="cpu") -> tuple[float, float]:
        """Loss and accuracy on ``(X_v, y_v)``.

        Returns:
            The pair ``(loss, accuracy)`` as floats.
        """
        self.model.to(device)
        self.model.eval()
        X_v, y_v = X_v.to(device), y_v.to(device)
        with torch.no_grad():
            y_hat = self.model(X_v)
            loss = self.criterion(y_hat.squeeze(), y_v.squeeze())
            accuracy = bin_acc(y_hat, y_v)
        self.model.to("cpu")
        return loss.item(), accuracy

    def do_train(self, n_epochs: int, X_t: torch.Tensor, y_t: torch.Tensor,
                 device="cpu") -> tuple[list[float], list[float]]:
        """``n_epochs`` full-batch steps on ``(X_t, y_t)``.

        Returns:
            The pair ``(train_loss, train_acc)``: lists with the values of the first epoch and of
                every tenth.
        """
        check_positive_int("n_epochs", n_epochs)
        train_loss, train_acc = [], []
        self.model.to(device)
        self.model.train()
        X_t, y_t = X_t.to(device), y_t.to(device)
        for epoch in range(n_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            y_hat = self.model(X_t)
            loss = self.criterion(y_hat.squeeze(), y_t.squeeze())
            loss.backward()
            self.optimizer.step()
            if epoch == 0 or (epoch + 1) % 10 == 0:
                train_loss.append(loss.item())
                train_acc.append(bin_acc(y_hat, y_t))
        self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        self.model.to("cpu")
        return train_loss, train_acc


def make_train(model: torch.nn.Module, data_gen, B_t: int, B_v: int, n_epochs: int,
               device="cpu", kind: str = "MLP", verbose: bool = False,
               etta: float = 1e-2) -> tuple[float, float, float, float, int]:
    """Draws ``B_t`` training and ``B_v`` validation samples from ``data_gen``, trains ``model``
    full batch for ``n_epochs`` with Adam (learning rate ``etta``) on the binary cross-entropy
    (``BCELoss``), and evaluates it. ``kind="MLP"`` feeds the bits as floats, anything else as
    tokens.

    Returns:
        The tuple ``(t_loss, t_acc, v_loss, v_acc, model_np)``: the last recorded training loss
            and accuracy, the validation loss and accuracy, and the number of parameters.
    """
    check_positive_int("B_t", B_t)
    check_positive_int("B_v", B_v)
    if not (isinstance(etta, (int, float)) and etta > 0):
        raise ValueError(f"etta (the learning rate) must be positive, got {etta!r}")
    X_train, y_train = data_gen.generate(B_t, verbose=False)
    X_valid, y_valid = data_gen.generate(B_v, verbose=False)
    trainer = Trainer(model, torch.optim.Adam(model.parameters(), lr=etta), torch.nn.BCELoss())
    model_np = get_n_parameters(model)
    if verbose:
        print(f"Number of the model's learnable parameters: {model_np}")
    if kind == "MLP":
        X_train, X_valid = X_train.float(), X_valid.float()
    t_loss, t_acc = trainer.do_train(n_epochs, X_train, y_train, device=device)
    v_loss, v_acc = trainer.do_eval(X_valid, y_valid, device=device)
    if verbose:
        print(f"Training loss: {t_loss[-1]:.3f}, accuracy: {t_acc[-1]:.3f}")
        print(f"Validation loss: {v_loss:.3f}, accuracy: {v_acc:.3f}")
    return t_loss[-1], t_acc[-1], v_loss, v_acc, model_np


def results_dict(results_sat_d, results_sat_s, results_mlp_d, results_mlp_s) -> OrderedDict:
    """The validation loss (rounded to 3 decimals), validation accuracy and parameter count of
    the four ``make_train`` results, under the tutorial's keys (e.g. "Validation Loss SAT
    dense")."""
    output = OrderedDict()
    for name, result in (("SAT dense", results_sat_d), ("SAT sparse", results_sat_s),
                         ("MLP dense", results_mlp_d), ("MLP sparse", results_mlp_s)):
        _, _, v_loss, v_acc, model_np = result
        output[f"Validation Loss {name}"] = round(v_loss, 3)
        output[f"Validation Accuracy {name}"] = v_acc
        output[f"Number of Parameters {name}"] = model_np
    return output


def set_seed(seed=None, seed_torch: bool = True) -> None:
    """Seeds Python's ``random``, numpy and (with ``seed_torch``) torch; a random seed when
    ``seed`` is None."""
    if seed is None:
        seed = int(np.random.choice(2 ** 32))
    random.seed(seed)
    np.random.seed(seed)
    if seed_torch:
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True


def set_device() -> str:
    """"cuda" when a GPU is available, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def gained_dot_product_attention(x: torch.Tensor, q_1: torch.Tensor, q_2: torch.Tensor,
                                 z_1: float, z_2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exercise 1: the weights w = softmax(z₁·q₁ + z₂·q₂) over the T inputs and the output
    y = w·x, as one query attending over T keys whose scores are the gained queries (through
    attnlab's operator, the scores entering as an additive mask).

    Returns:
        The pair ``(w, y)``: weights ``[T]`` and the scalar output.
    """
    for name, tensor in (("x", x), ("q_1", q_1), ("q_2", q_2)):
        check_tensor(name, tensor)
        if tensor.dim() != 1 or tensor.shape != x.shape:
            raise ValueError(f"x, q_1 and q_2 must be vectors of the same length, got "
                             f"{list(x.shape)}, {list(q_1.shape)}, {list(q_2.shape)}")
    for name, value in (("z_1", z_1), ("z_2", z_2)):
        if not math.isfinite(float(value)):
            raise ValueError(f"{name} must be a finite number, got {value}")
    length = x.shape[0]
    scores = (z_1 * q_1 + z_2 * q_2).to(x.dtype).reshape(1, length)
    y, w = _attention(x.new_zeros(1, 1), x.new_zeros(length, 1), x.reshape(length, 1),
                      attn_mask=scores, need_weights=True)
    return w.reshape(length), y.reshape(())


gained_dot_product_attention_implemented = gained_dot_product_attention
"""The tutorial's name for its own solution of exercise 1."""


# ---- plots -------------------------------------------------------------------------------------

def plot_loss_accuracy(t_loss, t_acc, v_loss=None, v_acc=None, show: bool = True) -> Figure | None:
    """Training loss (log scale) and accuracy curves, the validation values as stars at the end.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    fig = Figure(figsize=(12, 3.5), layout="constrained")
    loss_ax, acc_ax = fig.subplots(1, 2)
    loss_ax.plot(list(t_loss), color="tab:red", label="training loss")
    acc_ax.plot(list(t_acc), color="tab:red", linestyle="dotted", label="training accuracy")
    if v_loss is not None:
        loss_ax.scatter([len(t_loss) - 1], [v_loss], marker="*", color="tab:blue",
                        label="validation loss")
    if v_acc is not None:
        acc_ax.scatter([len(t_acc) - 1], [v_acc], marker="*", color="tab:blue",
                       label="validation accuracy")
    loss_ax.set(yscale="log", xlabel="record (first epoch, then every 10th)", ylabel="loss")
    acc_ax.set(ylim=(0, 1), xlabel="record (first epoch, then every 10th)", ylabel="accuracy")
    for ax in (loss_ax, acc_ax):
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Training and validation")
    return show_or_return(fig, show)


def plot_samples(X_plot: torch.Tensor, y_plot: torch.Tensor, correct_ids, title=None,
                 show: bool = True) -> Figure | None:
    """The samples as rows of black (1) and white (0) cells, the target columns ``correct_ids``
    boxed, each sample's label beside it.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    X_plot = torch.as_tensor(X_plot)
    fig = _plot.boolean_samples(X_plot, torch.as_tensor(y_plot).reshape(-1), list(correct_ids),
                                count=len(X_plot), title=title)
    return show_or_return(fig, show)


def _last_token_weights(att_weights: torch.Tensor, context_length: int) -> torch.Tensor:
    """[B, T, T] → the last token's weights over the tokens before it, [B, context_length]."""
    check_tensor("att_weights", att_weights)
    if att_weights.dim() != 3 or att_weights.shape[-1] - 1 != context_length:
        raise ValueError(f"att_weights must be [batch, T, T] with T - 1 = context_length = "
                         f"{context_length}, got {list(att_weights.shape)}")
    return att_weights[:, -1, :-1].detach().cpu().float()


def _box(ax, columns, bottom: float, height: float) -> None:
    for column in columns:
        ax.add_patch(Rectangle((column - 0.5, bottom), 1.0, height, fill=False,
                               edgecolor="tab:red", linewidth=2))


def plot_attention_weights(att_weights, correct_ids, context_length: int, labels,
                           show: bool = True) -> Figure | None:
    """The last token's attention weights over the ``context_length`` tokens before it, every
    sample of the batch as dots coloured by its label, the targets ``correct_ids`` boxed.
    ``att_weights`` are the scores ``[B, T, T]`` of ``SelfAttention(x, elaborate=True)``.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    weights = _last_token_weights(att_weights, context_length)
    labels = torch.as_tensor(labels).reshape(-1).cpu()
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    positions = torch.arange(context_length).repeat(len(weights), 1)
    for label, color, name in ((1, "#1E88E5", "True"), (0, "#FFC107", "False")):
        chosen = labels == label
        ax.scatter(positions[chosen].ravel().numpy(), weights[chosen].ravel().numpy(), alpha=0.5,
                   color=color, label=name)
    _box(ax, correct_ids, -0.1, 0.8)
    ax.set(ylim=(-0.1, 0.7), title="Attention weights for the whole batch",
           xlabel="Boolean input index t", ylabel="Attention weight")
    ax.legend(loc="upper right")
    return show_or_return(fig, show)


def plot_attention_weights_stats(att_weights, correct_ids, context_length: int, labels,
                                 show: bool = True) -> Figure | None:
    """The mean ± standard deviation over the batch of the last token's attention weights per
    input index, the targets ``correct_ids`` boxed.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    weights = _last_token_weights(att_weights, context_length)
    fig = Figure(figsize=(9, 5), layout="constrained")
    ax = fig.subplots()
    ax.errorbar(range(context_length), weights.mean(dim=0).numpy(),
                yerr=weights.std(dim=0).numpy() if len(weights) > 1 else None, fmt="o",
                color="blue")
    _box(ax, correct_ids, -0.1, 0.8)
    ax.set(ylim=(-0.1, 0.7), title="Attention weights statistics",
           xlabel="Boolean input index t", ylabel="Mean attention weight")
    return show_or_return(fig, show)


def plot_compare(results_sat_d, results_sat_s, results_mlp_d, results_mlp_s,
                 B_t_sat_s, B_t_sat_d, B_t_mlp_s, B_t_mlp_d, show: bool = True) -> Figure | None:
    """The four ``make_train`` results side by side (rows SAT and MLP, columns sparse and
    dense): parameters, training samples, training and validation accuracy.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    fig = Figure(figsize=(8, 6), layout="constrained")
    axes = fig.subplots(2, 2)
    panels = (("Attention", "sparse", results_sat_s, B_t_sat_s),
              ("Attention", "dense", results_sat_d, B_t_sat_d),
              ("MLP", "sparse", results_mlp_s, B_t_mlp_s),
              ("MLP", "dense", results_mlp_d, B_t_mlp_d))
    for ax, (model, density, result, samples) in zip(axes.ravel(), panels):
        _, t_acc, _, v_acc, model_np = result
        bars = ax.barh([2, 1], [t_acc, v_acc], color=["tab:orange", "tab:green"])
        for bar, text in zip(bars, (f"training acc: {t_acc:.0%}", f"validation acc: {v_acc:.0%}")):
            ax.text(0.02, bar.get_y() + bar.get_height() / 2, text, va="center")
        ax.text(0.02, 3.4, f"# parameters: {model_np}")
        ax.text(0.02, 2.9, f"# samples: {samples}")
        ax.set(xlim=(0, 1), ylim=(0.4, 3.8), xticks=[], yticks=[],
               title=f"{model}, {density}")
    return show_or_return(fig, show)


def plot_weights_and_output(gain_1: float, gain_2: float, show: bool = True) -> Figure | None:
    """Exercise 1's picture for the gains z₁ = ``gain_1``, z₂ = ``gain_2``: T = 20, x = a noisy
    sine, q₁ weighting the start and q₂ the end; prints y and shows q₁, q₂, w and x.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    seed = int(torch.randint(2 ** 31 - 1, ()))  # torch's global generator picks the noise
    x, q_1, q_2 = _gain_inputs(20, noise=0.1, seed=seed)
    w, y = gained_dot_product_attention(x, q_1, q_2, gain_1, gain_2)
    print(f"output y: {y.item()}")
    return show_or_return(_plot.gain_view(x, q_1, q_2, w, y.item(), gain_1, gain_2), show)


@torch.no_grad()
def plot_attention_graph(model: SelfAttention, data_generator: s_Sparse_AND_Query, m: int,
                         show: bool = True) -> Figure | None:
    """The rule task's "attention graph": for ``m`` fresh samples of ``data_generator``, the
    quantity Σⱼ scores[i, j]·linear.weight[j] of every position i, averaged over the positive
    samples of each rule, drawn as edges from the inputs to the output (one panel per rule,
    the rule's targets marked).

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    X_valid, y_valid = data_generator.generate(m, verbose=False)
    _, scores, _, _ = model(X_valid, elaborate=True)
    weighted = torch.einsum("bij,jk->bik", scores, model.linear.weight.T).squeeze(-1).cpu()
    rows = []
    for rule in (0, 1):
        chosen = (y_valid[:, 0] == 1) & (X_valid[:, -1] == rule)
        if not bool(chosen.any()):
            raise ValueError(f"plot_attention_graph: none of the {m} samples is positive with "
                             f"rule {rule}; draw more (m)")
        rows.append(weighted[chosen].mean(dim=0))
    fig = _plot.attention_graph(torch.stack(rows),
                                [data_generator.f_i_1, data_generator.f_i_2],
                                title="weights × readout per input, positive samples")
    return show_or_return(fig, show)
