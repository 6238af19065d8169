"""Sparse boolean functions and context-dependent attention (the Neuromatch NeuroAI tutorial W1D5 T3).

The label of a bit string is the AND of a few of its bits (the targets). A 65-parameter
self-attention model ("SAT") can find the targets by attending to them; an MLP with 150 times
more parameters is the baseline. In the rule task the last token says which of two target sets
counts, so the attention has to depend on the context.

Layout of a sample: T tokens, each a bit; the last token is the one whose attention the plots
show (the rule bit z in the rule task), so targets are drawn among the T − 1 tokens before it.

Which generator: the tutorial's prose speaks of "the s-sparse AND", but each of the four runs
behind its table draws its data from the generator *with a rule token* (its
``s_Sparse_AND_Query(17, s)``): 16 bits and a rule bit choosing between two target sets. The
table here uses that generator by default (``generator="rule-token"``), with its behaviour for
s = 4 (see ``RuleAndGenerator``); the plain s-sparse AND (``generator="plain"``) is a second,
separately labelled table. Losses are the tutorial's: torch's ``BCELoss`` on the sigmoid
outputs, for training and for the reported validation loss.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from .. import plot
from ..functional import scaled_dot_product_attention
from ..train import model_device, resolve_device

MAX_TRIES = 100
SPARSE_BIT_PROBABILITY = 0.5 ** (1 / 3)
RULE_BIT_PROBABILITY = 0.5 ** (1 / 2)

# The Neuromatch tutorial's table, one unseeded run each: (model, s) -> (parameters, val. accuracy, val. loss).
REFERENCE = {("SAT", 2): (65, 0.984, 0.081), ("SAT", 4): (65, 0.932, 3.12),
             ("MLP", 2): (9729, 0.934, 0.151), ("MLP", 4): (9729, 0.974, 0.090)}


class GeneratorError(RuntimeError):
    """The generator found no sample set obeying its rules within MAX_TRIES draws."""


def _check_count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _label_window_error(kind: str, n: int, window, last_mean: float, extra: str = "") -> str:
    return (f"{kind}: no {n} samples with a label mean in [{window[0]}, {window[1]}]{extra} "
            f"in {MAX_TRIES} draws (last label mean {last_mean:.3f}); draw more samples or "
            f"change seq_len/sparsity")


class SparseAndGenerator:
    """s-sparse AND on T bits: ``sparsity`` target indices drawn once (among the first T − 1),
    every bit 1 with probability 0.5^(1/3), label 1 iff all target bits are 1.

    ``sample(n)`` redraws (up to MAX_TRIES times) until the label mean lies in [0.4, 0.6] and
    no other column equals a target column, so the targets are identifiable."""

    label_window = (0.4, 0.6)

    def __init__(self, seq_len: int, sparsity: int, seed: int = 0):
        _check_count("sparsity", sparsity, 1)
        _check_count("seq_len", seq_len, 2)
        if seq_len < sparsity + 1:
            raise ValueError(f"seq_len must be at least sparsity + 1 = {sparsity + 1} (the "
                             f"targets come before the last token), got {seq_len}")
        self.seq_len, self.sparsity = seq_len, sparsity
        self.generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randperm(seq_len - 1, generator=self.generator)[:sparsity].sort().values

    def labels(self, bits: torch.Tensor) -> torch.Tensor:
        return bits[:, self.targets].all(dim=1).float()

    def _duplicates_a_target(self, bits: torch.Tensor) -> bool:
        others = torch.ones(self.seq_len, dtype=torch.bool)
        others[self.targets] = False
        # [targets, others]: does target column t equal other column o in every sample?
        equal = (bits[:, self.targets].unsqueeze(2) == bits[:, others].unsqueeze(1)).all(dim=0)
        return bool(equal.any())

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """bits [n, T] (int64, 0 or 1) and labels [n] (float 0. or 1.)."""
        _check_count("n", n, 1)
        low, high = self.label_window
        for _ in range(MAX_TRIES):
            bits = (torch.rand(n, self.seq_len, generator=self.generator)
                    < SPARSE_BIT_PROBABILITY).long()
            labels = self.labels(bits)
            mean = labels.mean().item()
            if low <= mean <= high and not self._duplicates_a_target(bits):
                return bits, labels
        raise GeneratorError(_label_window_error(
            f"SparseAndGenerator(seq_len={self.seq_len}, sparsity={self.sparsity})", n,
            self.label_window, mean, " and no column equal to a target column"))


class RuleAndGenerator:
    """s-sparse AND with a rule token (the tutorial's ``s_Sparse_AND_Query``): T − 1 bits (1
    with probability 0.5^(1/2)) and a last rule bit z (1 with probability 1/2); two disjoint
    target sets f₁, f₂ of size s, drawn once; label 1 iff (z = 0 and all f₁ bits are 1) or
    (z = 1 and all f₂ bits are 1).

    ``sample(n)`` draws the n rule bits once, then redraws the other bits (up to MAX_TRIES
    times) until the label mean lies in [0.45, 0.55]. When no draw does, it raises
    GeneratorError; with ``keep_last_draw`` it returns the last draw instead, as the
    tutorial's generator silently does. Both rules give a positive with probability
    p^s = 0.5^(s/2), so for s = 4 (0.25) the window is never met and the tutorial's data hold
    about 25 % positives. ``last_sample`` records the label mean of the last ``sample`` call
    and whether it met the window."""

    label_window = (0.45, 0.55)

    def __init__(self, seq_len: int, sparsity: int, seed: int = 0,
                 keep_last_draw: bool = False):
        _check_count("sparsity", sparsity, 1)
        _check_count("seq_len", seq_len, 2)
        if seq_len < 2 * sparsity + 1:
            raise ValueError(f"seq_len must be at least 2 * sparsity + 1 = {2 * sparsity + 1} "
                             f"(two disjoint target sets and the rule token), got {seq_len}")
        self.seq_len, self.sparsity = seq_len, sparsity
        self.keep_last_draw = keep_last_draw
        self.last_sample: dict | None = None
        self.generator = torch.Generator().manual_seed(seed)
        order = torch.randperm(seq_len - 1, generator=self.generator)
        self.targets = (order[:sparsity].sort().values, order[sparsity:2 * sparsity].sort().values)

    def labels(self, bits: torch.Tensor) -> torch.Tensor:
        rule = bits[:, -1].bool()
        first, second = (bits[:, t].all(dim=1) for t in self.targets)
        return torch.where(rule, second, first).float()

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """bits [n, T] (int64, 0 or 1; the last is the rule) and labels [n] (float)."""
        _check_count("n", n, 1)
        low, high = self.label_window
        rule = torch.rand(n, 1, generator=self.generator) < 0.5  # once per call, as the tutorial
        for draw in range(1, MAX_TRIES + 1):
            inputs = torch.rand(n, self.seq_len - 1, generator=self.generator) < RULE_BIT_PROBABILITY
            bits = torch.cat([inputs, rule], dim=1).long()
            labels = self.labels(bits)
            mean = labels.mean().item()
            if low <= mean <= high:
                self.last_sample = {"label_mean": mean, "window_met": True, "draws": draw}
                return bits, labels
        self.last_sample = {"label_mean": mean, "window_met": False, "draws": MAX_TRIES}
        if self.keep_last_draw:
            return bits, labels
        raise GeneratorError(_label_window_error(
            f"RuleAndGenerator(seq_len={self.seq_len}, sparsity={self.sparsity})", n,
            self.label_window, mean))


def _check_bits(bits: torch.Tensor, seq_len: int, model: str) -> None:
    if bits.dim() != 2 or bits.shape[1] != seq_len:
        raise ValueError(f"{model} expects bits of shape [batch, {seq_len}], got "
                         f"{list(bits.shape)}")
    if bits.dtype.is_floating_point or bits.dtype == torch.bool or bits.dtype.is_complex:
        raise ValueError(f"{model} expects integer bits (0 or 1), got dtype {bits.dtype}")
    if bits.numel() and (bits.min() < 0 or bits.max() > 1):
        raise ValueError(f"{model} expects bits that are 0 or 1, got values in "
                         f"[{int(bits.min())}, {int(bits.max())}]")


class MLP(nn.Module):
    """Linear(T, 512) → GELU → Dropout(0.1) → Linear(512, 1) → sigmoid (9,729 parameters at
    T = 17). The hidden layer's weights are N(0, 0.02) with zero biases; the output layer keeps
    PyTorch's default initialisation, as the tutorial's ``BinaryMLP`` does."""

    def __init__(self, seq_len: int, hidden: int = 512, dropout: float = 0.1):
        super().__init__()
        _check_count("seq_len", seq_len, 1)
        _check_count("hidden", hidden, 1)
        self.seq_len = seq_len
        self.net = nn.Sequential(nn.Linear(seq_len, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, 1))
        nn.init.normal_(self.net[0].weight, std=0.02)
        nn.init.zeros_(self.net[0].bias)

    def logits(self, bits: torch.Tensor) -> torch.Tensor:
        _check_bits(bits, self.seq_len, "MLP")
        return self.net(bits.float()).squeeze(-1)

    def forward(self, bits: torch.Tensor) -> torch.Tensor:
        """Probability of label 1, [B]."""
        return torch.sigmoid(self.logits(bits))


class SATOutput(NamedTuple):
    probabilities: torch.Tensor  # [B]
    logits: torch.Tensor         # [B]
    scores: torch.Tensor         # [B, T]: the attention output of every token, the readout's input
    attention: torch.Tensor      # [B, T, T]: softmax weights, query × key (detached)


class SAT(nn.Module):
    """One self-attention head on 2-d token embeddings: embedding of the symbols 0 and 1 plus a
    learned position [1, T, d]; W_q, W_k: d → d and W_v: d → 1 without biases; the attention
    output [B, T] is read out by Linear(T, 1) without bias and a sigmoid. Every weight is drawn
    from N(0, 0.001): 65 parameters at T = 17 and d = 2."""

    def __init__(self, seq_len: int, dim: int = 2, init_std: float = 1e-3):
        super().__init__()
        _check_count("seq_len", seq_len, 1)
        _check_count("dim", dim, 1)
        self.seq_len = seq_len
        self.embedding = nn.Embedding(2, dim)
        self.position = nn.Parameter(torch.empty(1, seq_len, dim))
        self.W_q = nn.Linear(dim, dim, bias=False)
        self.W_k = nn.Linear(dim, dim, bias=False)
        self.W_v = nn.Linear(dim, 1, bias=False)
        self.readout = nn.Linear(seq_len, 1, bias=False)
        for parameter in self.parameters():
            nn.init.normal_(parameter, std=init_std)

    def _run(self, bits: torch.Tensor) -> SATOutput:
        _check_bits(bits, self.seq_len, "SAT")
        x = self.embedding(bits) + self.position                      # [B, T, d]
        output, weights = scaled_dot_product_attention(self.W_q(x), self.W_k(x), self.W_v(x),
                                                       need_weights=True)  # [B, T, 1], [B, T, T]
        scores = output.squeeze(-1)
        logits = self.readout(scores).squeeze(-1)
        return SATOutput(torch.sigmoid(logits), logits, scores, weights)

    def logits(self, bits: torch.Tensor) -> torch.Tensor:
        return self._run(bits).logits

    def forward(self, bits: torch.Tensor, elaborate: bool = False):
        """Probability of label 1 [B]; with ``elaborate`` a SATOutput (probabilities, logits,
        scores, attention)."""
        result = self._run(bits)
        return result if elaborate else result.probabilities


MODELS = {"SAT": SAT, "MLP": MLP}


def parameter_count(model: nn.Module) -> int:
    """The number of parameters of ``model``."""
    return sum(p.numel() for p in model.parameters())


def tutorial_bce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The tutorial's loss: torch's ``BCELoss`` on the sigmoid outputs, which clamps each log at
    −100 (a confidently wrong sample costs at most 100, and one whose sigmoid has saturated
    gives no gradient). ``binary_cross_entropy_with_logits`` would differ exactly there."""
    return F.binary_cross_entropy(torch.sigmoid(logits), labels)


@torch.no_grad()
def evaluate(model: nn.Module, bits: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy (a probability above 0.5 counts as 1, as the tutorial's rounding does) and the
    tutorial's binary cross-entropy (``tutorial_bce``) of ``model`` on one full batch (moved to
    the model's device)."""
    model.eval()
    device = model_device(model)
    bits, labels = bits.to(device), labels.to(device)
    logits = model.logits(bits)
    return {"accuracy": ((logits > 0).float() == labels).float().mean().item(),
            "loss": tutorial_bce(logits, labels).item()}


def train_full_batch(model: nn.Module, train: tuple[torch.Tensor, torch.Tensor],
                     val: tuple[torch.Tensor, torch.Tensor], epochs: int, lr: float,
                     progress: bool = False, desc: str | None = None,
                     device: str | torch.device | None = None) -> dict:
    """Adam on the tutorial's binary cross-entropy (``tutorial_bce``) of the whole training
    set, one step per epoch, on
    ``device`` (default: where the model is; the model and the data are moved there).
    Returns the per-epoch training losses, the final train and validation metrics and the
    seconds taken. Seed torch before building the model for a repeatable run (dropout draws
    from torch's global generator)."""
    _check_count("epochs", epochs, 1)
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    device = resolve_device(device if device is not None else model_device(model))
    model.to(device)
    bits, labels = train[0].to(device), train[1].to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    # Steps on a model this small are dominated by overhead; more threads only add to it (and
    # thrash when the cores are busy), so train on one and restore the caller's setting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        for _ in tqdm(range(epochs), desc=desc, disable=not progress, leave=False):
            model.train()
            optimizer.zero_grad()
            loss = tutorial_bce(model.logits(bits), labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    return {"train_losses": losses, "train": evaluate(model, bits, labels),
            "val": evaluate(model, *val), "seconds": seconds}


GENERATORS = ("rule-token", "plain")


@dataclass
class SparseAndConfig:
    """The table's setting. ``generator``: "rule-token" (the tutorial's runs: 16 bits and a rule
    bit, two target sets, its label-window fallback for s = 4) or "plain" (the s-sparse AND of
    the tutorial's prose, on T bits)."""

    generator: str = "rule-token"
    seq_len: int = 17
    sparsities: tuple[int, ...] = (2, 4)
    train_size: int = 200
    val_size: int = 500
    mlp_epochs: int = 500
    mlp_lr: float = 1e-3
    sat_epochs: int = 2000
    sat_lr: float = 1e-2
    seeds: int = 5

    def __post_init__(self):
        if self.generator not in GENERATORS:
            raise ValueError(f"generator must be one of {', '.join(GENERATORS)}, got "
                             f"{self.generator!r}")
        _check_count("seeds", self.seeds, 1)
        for name in ("train_size", "val_size", "mlp_epochs", "sat_epochs"):
            _check_count(name, getattr(self, name), 1)
        if not self.sparsities:
            raise ValueError("sparsities must name at least one s")
        for s in self.sparsities:
            _check_count("each of sparsities", s, 1)
        needed = (2 if self.generator == "rule-token" else 1) * max(self.sparsities) + 1
        if self.seq_len < needed:
            raise ValueError(f"seq_len must be at least {needed} for the {self.generator} "
                             f"generator with s = {max(self.sparsities)}, got {self.seq_len}")


def default_config(seeds: int = 5, generator: str = "rule-token") -> SparseAndConfig:
    """The Neuromatch tutorial's recipe, ``seeds`` runs per row, on ``generator``."""
    return SparseAndConfig(seeds=seeds, generator=generator)


def fast_config(seeds: int = 2, generator: str = "rule-token") -> SparseAndConfig:
    """A quarter of the SAT's epochs and 200 of the MLP's, two seeds: seconds."""
    return SparseAndConfig(seeds=seeds, sat_epochs=500, mlp_epochs=200, generator=generator)


def make_generator(config: SparseAndConfig, sparsity: int, seed: int):
    """The configured generator for ``sparsity`` and ``seed``: the rule-token one keeps its last
    draw when the label window cannot be met, as the tutorial's does."""
    if config.generator == "plain":
        return SparseAndGenerator(config.seq_len, sparsity, seed=seed)
    return RuleAndGenerator(config.seq_len, sparsity, seed=seed, keep_last_draw=True)


def target_positions(generator) -> list[int]:
    """Every target index of a generator (both sets of the rule-token one), sorted."""
    targets = generator.targets
    if isinstance(targets, tuple):
        return sorted(int(t) for part in targets for t in part)
    return sorted(int(t) for t in targets)


def run_one(model_name: str, sparsity: int, seed: int, config: SparseAndConfig,
            progress: bool = False, device: str | torch.device | None = None) -> dict:
    """Train one model on one seed's data, on ``device`` (default the CPU). The data depend on
    (seed, sparsity, generator, sizes) only, so the SAT and the MLP of a seed see the same
    samples; they are drawn on the CPU and kept there in the result, with ``data_draws``: each
    split's label mean and, for the rule-token generator, whether it met the label window."""
    generator = make_generator(config, sparsity, seed)
    train = generator.sample(config.train_size)
    draws = {"train": getattr(generator, "last_sample", None)}
    val = generator.sample(config.val_size)
    draws["val"] = getattr(generator, "last_sample", None)
    draws = {split: draw or {"label_mean": labels.mean().item(), "window_met": True}
             for (split, draw), labels in zip(draws.items(), (train[1], val[1]))}
    torch.manual_seed(seed)
    model = MODELS[model_name](config.seq_len)
    epochs, lr = ((config.sat_epochs, config.sat_lr) if model_name == "SAT"
                  else (config.mlp_epochs, config.mlp_lr))
    result = train_full_batch(model, train, val, epochs, lr, progress=progress,
                              desc=f"{model_name} s={sparsity} seed {seed}", device=device)
    return {"model": model, "generator": generator, "train_data": train, "val_data": val,
            "data_draws": draws, **result}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def results_table(config: SparseAndConfig, first_seed: int = 0, progress: bool = False,
                  keep_runs: bool = False, device: str | torch.device | None = None,
                  seeds: list[int] | None = None) -> dict:
    """The four rows of the Neuromatch tutorial's table (SAT and MLP × each s) over ``seeds``
    (default: ``config.seeds`` seeds from ``first_seed``): ``rows`` (mean ± std of val. accuracy
    and loss, per-seed values with each split's label mean, parameters, seconds), the
    ``generator`` used and, with ``keep_runs``, ``runs[(model, s)]`` = the run of the first seed
    (model and data, for the plots)."""
    seeds = list(range(first_seed, first_seed + config.seeds)) if seeds is None else list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    rows, runs = [], {}
    for model_name in ("SAT", "MLP"):
        for s in config.sparsities:
            per_seed = []
            for seed in seeds:
                run = run_one(model_name, s, seed, config, progress=progress, device=device)
                per_seed.append({"seed": seed, "val_accuracy": run["val"]["accuracy"],
                                 "val_loss": run["val"]["loss"],
                                 "train_accuracy": run["train"]["accuracy"],
                                 "seconds": run["seconds"], "data": run["data_draws"]})
                if keep_runs and seed == seeds[0]:
                    runs[(model_name, s)] = run
            accuracy = _mean_std([r["val_accuracy"] for r in per_seed])
            loss = _mean_std([r["val_loss"] for r in per_seed])
            rows.append({"model": model_name, "s": s,
                         "parameters": parameter_count(MODELS[model_name](config.seq_len)),
                         "val_accuracy_mean": accuracy[0], "val_accuracy_std": accuracy[1],
                         "val_loss_mean": loss[0], "val_loss_std": loss[1],
                         "seconds": sum(r["seconds"] for r in per_seed), "seeds": per_seed,
                         # The tutorial's figures are for its rule-token generator only.
                         "reference": (REFERENCE.get((model_name, s))
                                       if config.generator == "rule-token" else None)})
    return {"config": asdict(config), "generator": config.generator, "first_seed": seeds[0],
            "seed_list": seeds, "rows": rows, "runs": runs}


def format_table(rows: list[dict], generator: str | None = None) -> str:
    """The table as text, with the tutorial's reference beside each row (rule-token generator
    only: the tutorial ran no other) and, when given, a first line naming the generator."""
    lines = [] if generator is None else [
        f"generator: {generator}" + (" (the tutorial's s_Sparse_AND_Query, as its four runs)"
                                     if generator == "rule-token" else
                                     " (the s-sparse AND of the tutorial's prose; the tutorial's "
                                     "figures are not for this generator)")]
    lines += [f"{'model':5} {'s':>2} {'params':>7}  {'val. accuracy':>15}  {'val. loss':>15}"
              f"   reference (acc. / loss)"]
    for row in rows:
        reference = row["reference"]
        lines.append(f"{row['model']:5} {row['s']:>2} {row['parameters']:>7,}  "
                     f"{row['val_accuracy_mean']:.3f} ± {row['val_accuracy_std']:.3f}  "
                     f"{row['val_loss_mean']:7.3f} ± {row['val_loss_std']:.3f}   "
                     + (f"{reference[1]:.3f} / {reference[2]}" if reference else "-"))
    return "\n".join(lines)


@torch.no_grad()
def last_token_attention(model: SAT, bits: torch.Tensor) -> torch.Tensor:
    """[B, T − 1]: the last token's attention weights over the inputs before it (on the
    CPU)."""
    model.eval()
    return model(bits.to(model_device(model)), elaborate=True).attention[:, -1, :-1].cpu()


# ---- the rule task ---------------------------------------------------------------------------

@dataclass
class RuleAndConfig:
    seq_len: int = 11
    sparsity: int = 2
    train_size: int = 300
    val_size: int = 500
    epochs: int = 1000
    lr: float = 1e-2

    def __post_init__(self):
        for name in ("train_size", "val_size", "epochs"):
            _check_count(name, getattr(self, name), 1)


def rule_default_config() -> RuleAndConfig:
    return RuleAndConfig()


def rule_fast_config() -> RuleAndConfig:
    return RuleAndConfig(epochs=500)


GRAPH_SAMPLES = 200  # fresh samples the tutorial draws for its attention graph


@torch.no_grad()
def attention_graph(model: SAT, bits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[2, T]: the tutorial's attention graph. For every position i the quantity
    Σⱼ attention[i, j] · readout.weight[j] (the softmax weights times the readout,
    ``einsum("bij,jk->bik", scores, linear.weight.T)`` in the tutorial's names), averaged over the
    positive samples of rule 0 (first row) and of rule 1 (second row). The tutorial computes it
    on fresh samples (``GRAPH_SAMPLES`` of them), which ``run_rule_task`` draws."""
    model.eval()
    output = model(bits.to(model_device(model)), elaborate=True)
    weighted = torch.einsum("bij,j->bi", output.attention, model.readout.weight[0]).cpu()
    rows = []
    for rule in (0, 1):
        chosen = (bits[:, -1] == rule) & (labels == 1)
        if not chosen.any():
            raise ValueError(f"attention_graph needs positive samples with rule {rule}, got none "
                             f"among {len(labels)} samples")
        rows.append(weighted[chosen].mean(dim=0))
    return torch.stack(rows)


def standing_out(edges: torch.Tensor, count: int) -> list[list[int]]:
    """For each row of the graph, the ``count`` inputs (among the T − 1, not the rule token)
    whose values stand out most from the row's median: every edge of a row shares a common
    level (the readout's mean weight), which can be large and of either sign, so what the
    graph shows is the departure from it."""
    inputs = edges[:, :-1]
    departure = (inputs - inputs.median(dim=1, keepdim=True).values).abs()
    return [sorted(row.topk(count).indices.tolist()) for row in departure]


def targets_lead(edges: torch.Tensor, targets) -> list[bool]:
    """For each rule r: are its targets the inputs that stand out most in its row of the graph
    (``standing_out``)?"""
    return [set(shown) == set(rule_targets.tolist())
            for shown, rule_targets in zip(standing_out(edges, len(targets[0])), targets)]


def run_rule_task(config: RuleAndConfig, seed: int = 0, progress: bool = False,
                  device: str | torch.device | None = None) -> dict:
    """Train the SAT on the rule task on ``device`` (default the CPU); its metrics, the
    tutorial's attention graph on ``GRAPH_SAMPLES`` fresh samples (on the CPU) and whether each
    rule's targets lead it."""
    generator = RuleAndGenerator(config.seq_len, config.sparsity, seed=seed)
    train, val = generator.sample(config.train_size), generator.sample(config.val_size)
    torch.manual_seed(seed)
    model = SAT(config.seq_len)
    result = train_full_batch(model, train, val, config.epochs, config.lr, progress=progress,
                              desc=f"SAT rule task seed {seed}", device=device)
    fresh = generator.sample(GRAPH_SAMPLES)
    edges = attention_graph(model, *fresh)
    return {"model": model, "generator": generator, "train_data": train, "val_data": val,
            "graph_data": fresh, "edges": edges,
            "targets_lead": targets_lead(edges, generator.targets), **result}


def rule_seeds_summary(runs: list[dict], config: RuleAndConfig, seeds: list[int]) -> dict:
    """results.json of ``rule-and`` over several seeds: per seed the metrics, targets, graph and
    recovery; over the seeds the mean ± std of the validation accuracy and, per rule, in how
    many seeds its targets lead the graph."""
    per_seed = [rule_summary(run, config, seed) for run, seed in zip(runs, seeds)]
    accuracy = _mean_std([run["val"]["accuracy"] for run in per_seed])
    return {"config": asdict(config), "seeds": seeds, "graph_samples": GRAPH_SAMPLES,
            "graph": "mean over each rule's positive fresh samples of "
                     "sum_j attention[i, j] * readout.weight[j] (the tutorial's quantity)",
            "val_accuracy_mean": accuracy[0], "val_accuracy_std": accuracy[1],
            "recovered": {f"rule {rule}": sum(run["targets_lead"][rule] for run in per_seed)
                          for rule in (0, 1)},
            "runs": per_seed}


# ---- the gain demo ---------------------------------------------------------------------------

def gain_inputs(length: int = 20, noise: float = 0.1, seed: int = 0):
    """x = sin over [0, 2π] plus Gaussian noise; q₁ = 1 − sigmoid(linspace(−3, 7)) (weight at the
    start), q₂ = sigmoid(linspace(−7, 3)) (weight at the end), each normalised to sum 1."""
    _check_count("length", length, 2)
    generator = torch.Generator().manual_seed(seed)
    x = torch.sin(torch.linspace(0, 2 * math.pi, length)) + noise * torch.randn(length,
                                                                               generator=generator)
    q1 = 1 - torch.sigmoid(torch.linspace(-3, 7, length))
    q2 = torch.sigmoid(torch.linspace(-7, 3, length))
    return x, q1 / q1.sum(), q2 / q2.sum()


def gain_weights(z1: float, z2: float, length: int = 20, seed: int = 0):
    """w = softmax(z₁q₁ + z₂q₂) and y = w·x: the gains z scale the scores, and a larger gain
    makes w sparser (more of its mass on fewer positions)."""
    for name, value in (("z1", z1), ("z2", z2)):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    x, q1, q2 = gain_inputs(length, seed=seed)
    w = torch.softmax(z1 * q1 + z2 * q2, dim=0)
    return w, torch.dot(w, x)


# ---- figures and summaries for the command line and the notebook -----------------------------

def table_figures(table: dict) -> dict:
    """PNG name -> figure for a ``results_table(..., keep_runs=True)``: samples with the targets
    boxed, the SAT's last-token attention for each s, the four results side by side."""
    figures = {}
    for (model_name, s), run in table["runs"].items():
        bits, labels = run["val_data"]
        targets = target_positions(run["generator"])
        kind = ("with a rule token (last), both target sets boxed"
                if isinstance(run["generator"], RuleAndGenerator) else "plain")
        if model_name == "SAT":
            figures[f"samples_s{s}"] = plot.boolean_samples(
                bits, labels, targets,
                title=f"{s}-sparse AND {kind}, T = {bits.shape[1]}: samples")
            figures[f"attention_s{s}"] = plot.last_token_attention(
                last_token_attention(run["model"], bits), labels, targets,
                title=f"SAT, s = {s}: last token's attention on the validation set")
    figures["results"] = plot.sparse_and_results(table["rows"])
    return figures


def table_summary(table: dict) -> dict:
    """What results.json keeps of a table: config and rows (not the models)."""
    return {key: value for key, value in table.items() if key != "runs"}


def rule_summary(run: dict, config: RuleAndConfig, seed: int) -> dict:
    """What results.json keeps of one rule-task run: metrics, targets, the graph, the inputs
    standing out in each rule's row and whether they are the rule's targets."""
    targets = [t.tolist() for t in run["generator"].targets]
    return {"config": asdict(config), "seed": seed, "val": run["val"], "train": run["train"],
            "seconds": run["seconds"], "targets": targets, "edges": run["edges"].tolist(),
            "standing_out": standing_out(run["edges"], len(targets[0])),
            "targets_lead": run["targets_lead"]}


def format_rule_seeds(summary: dict) -> str:
    """``rule_seeds_summary`` as text: one line per seed, then the counts."""
    lines = []
    for run in summary["runs"]:
        rules = []
        for rule, (shown, lead) in enumerate(zip(run["standing_out"], run["targets_lead"])):
            whose = ("its own targets" if lead else "rule {}'s targets".format(1 - rule)
                     if sorted(shown) == sorted(run["targets"][1 - rule]) else "no rule's targets")
            rules.append(f"rule {rule} row highlights {shown} ({whose})")
        lines.append(f"seed {run['seed']}: val. accuracy {run['val']['accuracy']:.3f}; targets "
                     f"{run['targets']}; " + "; ".join(rules))
    seeds = len(summary["runs"])
    lines.append(f"val. accuracy {summary['val_accuracy_mean']:.3f} ± "
                 f"{summary['val_accuracy_std']:.3f} over {seeds} seeds; targets recovered: "
                 + ", ".join(f"{rule} in {count} of {seeds}"
                             for rule, count in summary["recovered"].items()))
    return "\n".join(lines)


def format_rule_summary(summary: dict) -> str:
    """One rule-task run as text: accuracy, then each rule's targets and largest weights."""
    lines = [f"SAT on the rule task (T = {summary['config']['seq_len']}, s = "
             f"{summary['config']['sparsity']}): val. accuracy {summary['val']['accuracy']:.3f}, "
             f"val. loss {summary['val']['loss']:.3f}"]
    for rule, (targets, shown, lead) in enumerate(zip(summary["targets"],
                                                      summary["standing_out"],
                                                      summary["targets_lead"])):
        lines.append(f"rule {rule}: targets {targets}, standing out at {shown} -> "
                     f"{'targets recovered' if lead else 'NOT recovered'}")
    return "\n".join(lines)


# ---- Exercise 3.4: sample complexity ----------------------------------------------------------

SWEEP_SIZES = (25, 50, 100, 200, 400, 800, 1600, 3200)


def sample_complexity(config: SparseAndConfig, sizes=SWEEP_SIZES, seeds=(0, 1, 2, 3, 4),
                      sparsity: int = 2, models=("SAT", "MLP"), progress: bool = False,
                      device: str | torch.device | None = None) -> dict:
    """The tutorial's Exercise 3.4: the validation accuracy of each model against the number of
    training samples (``sizes``, increasing) for ``sparsity``, on the configured generator, the
    rest of the recipe unchanged. Per model and seed: the accuracy at every size and the first
    size at which it reaches 100 % (None when no size does); over the seeds the mean ± std of
    that size (over the seeds that reached it) and of the accuracy at each size."""
    sizes = [int(size) for size in sizes]
    if not sizes or sizes != sorted(set(sizes)) or sizes[0] < 1:
        raise ValueError(f"sizes must be increasing positive sample counts, got {sizes}")
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    if sparsity not in config.sparsities:
        config = dataclasses.replace(config, sparsities=(sparsity,))
    models_out = {}
    for model_name in models:
        if model_name not in MODELS:
            raise ValueError(f"models must be among {', '.join(MODELS)}, got {model_name!r}")
        per_seed = []
        for seed in seeds:
            accuracies = []
            for size in sizes:
                run = run_one(model_name, sparsity, seed,
                              dataclasses.replace(config, train_size=size), progress=progress,
                              device=device)
                accuracies.append(run["val"]["accuracy"])
            first = next((size for size, accuracy in zip(sizes, accuracies) if accuracy == 1.0),
                         None)
            per_seed.append({"seed": seed, "val_accuracy": accuracies,
                             "first_size_at_100": first})
        reached = [run["first_size_at_100"] for run in per_seed
                   if run["first_size_at_100"] is not None]
        by_size = [_mean_std([run["val_accuracy"][i] for run in per_seed])
                   for i in range(len(sizes))]
        models_out[model_name] = {
            "parameters": parameter_count(MODELS[model_name](config.seq_len)),
            "seeds": per_seed,
            "val_accuracy_mean": [m for m, _ in by_size],
            "val_accuracy_std": [sd for _, sd in by_size],
            "reached_100": len(reached),
            "first_size_at_100_mean": _mean_std(reached)[0] if reached else None,
            "first_size_at_100_std": _mean_std(reached)[1] if reached else None}
    return {"config": asdict(config), "generator": config.generator, "sparsity": sparsity,
            "sizes": sizes, "seed_list": seeds, "models": models_out}


def format_sample_complexity(sweep: dict) -> str:
    """The sweep as text: mean validation accuracy per size and model, then the first size at
    100 % per seed and its mean ± std."""
    sizes = sweep["sizes"]
    lines = [f"Exercise 3.4, s = {sweep['sparsity']}, {sweep['generator']} generator: "
             f"validation accuracy (mean over {len(sweep['seed_list'])} seeds) by training "
             f"samples",
             f"{'samples':>8} " + " ".join(f"{name:>7}" for name in sweep["models"])]
    for i, size in enumerate(sizes):
        lines.append(f"{size:>8} " + " ".join(f"{model['val_accuracy_mean'][i]:>7.3f}"
                                              for model in sweep["models"].values()))
    for name, model in sweep["models"].items():
        firsts = ", ".join(f"seed {run['seed']}: {run['first_size_at_100'] or 'not reached'}"
                           for run in model["seeds"])
        count = len(model["seeds"])
        summary = (f"{model['first_size_at_100_mean']:.0f} ± {model['first_size_at_100_std']:.0f}"
                   f" over the {model['reached_100']} of {count} seeds that reach it"
                   if model["reached_100"] else f"not reached in {count} seeds")
        lines.append(f"{name}: first size at 100 % — {firsts}; {summary}")
    return "\n".join(lines)
