"""Permutation composition (the permutation-composition lab): the input is two permutations p₁, p₂ of 0..n−1 side by
side, the target at position n + i is p₃[i] = p₁[p₂[i]]. The value sits at input position p₂[i],
so the query at n + i has to turn the digit it reads, p₂[i], into a position and look there: the
keys can only tell positions apart when a positional encoding is part of them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .. import plot
from ..nn import (AdditiveAttention, MultiplicativeAttention, PositionalEncoder,
                  ScaledDotProductAttention, autoregressive_mask)
from ..train import Task, TrainConfig, model_device
from .sparsity import attention_zero_counts, check_experiment_normalizer, normalizer_suffix

ATTENTION_KINDS = ("additive", "multiplicative", "scaled")
POSITION_MODES = ("add", "concat", "none")
READOUT_INITS = ("embedding", "random")


def check_choices(attention: str, position: str, readout_init: str = "embedding") -> None:
    """Raises ValueError naming the argument when a choice is not one of its kind's."""
    if readout_init not in READOUT_INITS:
        raise ValueError(f"readout_init must be one of {', '.join(READOUT_INITS)}, got "
                         f"{readout_init!r}")
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got "
                         f"{attention!r}")
    if position not in POSITION_MODES:
        raise ValueError(f"position must be one of {', '.join(POSITION_MODES)}, got "
                         f"{position!r}")


@dataclass
class PermutationConfig:
    n: int = 10
    attention: str = "scaled"        # one of ATTENTION_KINDS
    position: str = "add"            # one of POSITION_MODES
    autoregressive: bool = False     # query i attends to positions j <= i only
    embed_dim: int = 32
    additive_hidden: int = 32        # hidden size of the additive (Bahdanau) scores
    # The sinusoids' base (PositionalEncoder's scale). Below 1 the frequencies run from 1 to
    # 1/scale radians per position, so the 2n codes are nearly orthogonal: a bounded LSTM
    # query can then single out one position, even through the 1/sqrt(d) of scaled scores.
    # With 100 neighbouring codes are alike and scaled attention stalled at 92 % in our
    # trials (at 30 % after 600 steps with 10000).
    position_scale: float = 0.1
    # How the output layer starts: "embedding" (its rows are the digit embeddings, so from the
    # first step the model gains by attending *to* p₂[i] and reading the digit there) or
    # "random" (PyTorch's default). With "random" the task has a second, sign-flipped solution
    # that about half the seeds find: attend to everything *but* p₂[i] and name the digit
    # missing from the mix (see the experiment's page).
    readout_init: str = "embedding"
    # How every attention kind turns its scores into weights: softmax, sparsemax or entmax15.
    normalizer: str = "softmax"
    batch_size: int = 64
    batches_per_epoch: int = 500
    val_size: int = 1_000
    test_size: int = 10_000
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        epochs=4, lr=3e-3, warmup=100, grad_clip=5.0))

    def __post_init__(self):
        check_choices(self.attention, self.position, self.readout_init)
        check_experiment_normalizer(self.normalizer)
        if self.n < 2:
            raise ValueError(f"n (the permutation length) must be at least 2, got {self.n}")
        for name in ("embed_dim", "additive_hidden", "batch_size", "batches_per_epoch",
                     "val_size", "test_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.position_scale <= 0:
            raise ValueError(f"position_scale must be positive, got {self.position_scale}")

    @property
    def variant(self) -> str:
        """Short name of the model variant, e.g. "scaled-add-autoregressive" (with
        "-random-readout" when the output layer starts at PyTorch's default, and the normalizer
        last unless it is softmax: "scaled-add-autoregressive-sparsemax")."""
        return "-".join([self.attention, self.position]
                        + (["autoregressive"] if self.autoregressive else [])
                        + (["random-readout"] if self.readout_init == "random" else [])) \
            + normalizer_suffix(self.normalizer)


def default_config(seed: int = 0) -> PermutationConfig:
    """The full run: 4 epochs of 500 fresh batches of 64 (under a minute on one core)."""
    return PermutationConfig(train=dataclasses.replace(PermutationConfig().train, seed=seed))


def fast_config(seed: int = 0) -> PermutationConfig:
    """A short run of 2 epochs of 300 batches, tested to reach ≥ 95 % with positions."""
    return PermutationConfig(batches_per_epoch=300, test_size=2_000,
                             train=dataclasses.replace(PermutationConfig().train, epochs=2,
                                                       seed=seed))


def permutation_batch(batch_size: int, n: int, generator: torch.Generator | None = None):
    """(inputs, targets), both [batch_size, 2n] int64: inputs = p₁ followed by p₂, targets = n
    zeros followed by p₃ = p₁[p₂]."""
    if batch_size < 1 or n < 1:
        raise ValueError(f"batch_size and n must be at least 1, got {batch_size} and {n}")
    p1 = torch.rand(batch_size, n, generator=generator).argsort(-1)
    p2 = torch.rand(batch_size, n, generator=generator).argsort(-1)
    inputs = torch.cat([p1, p2], 1)
    return inputs, composition_targets(inputs)


def composition_targets(inputs: torch.Tensor) -> torch.Tensor:
    """[B, 2n] → [B, 2n]: n zeros, then p₃[i] = p₁[p₂[i]] for inputs = p₁ followed by p₂."""
    if inputs.dim() != 2 or inputs.shape[1] % 2:
        raise ValueError(f"inputs must be [batch, 2n], got shape {list(inputs.shape)}")
    p1, p2 = inputs.chunk(2, dim=1)
    p3 = p1.gather(1, p2)
    return torch.cat([torch.zeros_like(p3), p3], 1)


class PermutationModel(nn.Module):
    """Embedding(n, e) → positional encoder (added, concatenated or none) → LSTM → attention
    with the LSTM outputs as queries and the embedded sequence as keys and values → Linear to
    n logits per position. ``attention.last_weights`` holds the map of the last forward.

    ``readout_init="embedding"`` starts the output Linear with the digit embeddings as its
    rows (zero for the concatenated positional part, zero bias): the logit of digit c starts
    as the match of what was read with c's embedding. ``"random"`` keeps PyTorch's default.

    ``normalizer`` (``"softmax"``, ``"sparsemax"``, ``"entmax15"``, or ``"entmax"`` with
    ``alpha``) is how every attention kind turns its scores into weights, through the
    attention operator."""

    def __init__(self, n: int, embed_dim: int, attention: str = "scaled", position: str = "add",
                 autoregressive: bool = False, additive_hidden: int = 32,
                 position_scale: float = 0.1, readout_init: str = "embedding",
                 normalizer: str = "softmax", alpha: float | None = None):
        super().__init__()
        check_choices(attention, position, readout_init)
        self.n, self.autoregressive = n, autoregressive
        self.embedding = nn.Embedding(n, embed_dim)
        self.positions = (None if position == "none" else
                          PositionalEncoder(embed_dim, max_len=2 * n, scale=position_scale,
                                            add=position == "add"))
        width = embed_dim + (self.positions.extra_output_shape if self.positions else 0)
        # The queries are as wide as the objects, as the dot-product kinds need.
        self.lstm = nn.LSTM(width, width, batch_first=True)
        chosen = dict(normalizer=normalizer, alpha=alpha)
        self.attention = (AdditiveAttention(width, width, additive_hidden, **chosen)
                          if attention == "additive" else
                          MultiplicativeAttention(**chosen) if attention == "multiplicative" else
                          ScaledDotProductAttention(**chosen))
        self.output = nn.Linear(width, n)
        if readout_init == "embedding":  # overwrites, draws nothing: the rest is as "random"
            with torch.no_grad():
                self.output.weight.zero_()
                self.output.weight[:, :embed_dim].copy_(self.embedding.weight)
                self.output.bias.zero_()

    def forward(self, digits: torch.Tensor) -> torch.Tensor:
        """digits [B, L] in [0, n) → logits [B, L, n]"""
        if digits.dim() != 2 or digits.dtype != torch.long:
            raise ValueError(f"digits must be an int64 tensor [batch, length], got "
                             f"{digits.dtype} of shape {list(digits.shape)}")
        if digits.numel() and (int(digits.min()) < 0 or int(digits.max()) >= self.n):
            raise ValueError(f"digits must lie in [0, {self.n}), got values from "
                             f"{int(digits.min())} to {int(digits.max())}")
        objects = self.embedding(digits)                      # [B, L, e]
        if self.positions is not None:
            objects = self.positions(objects)                 # [B, L, e] or [B, L, 2e]
        queries, _ = self.lstm(objects)                       # [B, L, width]
        mask = (autoregressive_mask(digits.shape[1], digits.device)
                if self.autoregressive else None)
        return self.output(self.attention.attend(objects, queries, mask))

    @torch.no_grad()
    def attention_map(self, digits: torch.Tensor) -> torch.Tensor:
        """[B, L, L]: the weights of every query over every input position."""
        self(digits)
        return self.attention.last_weights


def make_model(config: PermutationConfig) -> PermutationModel:
    return PermutationModel(config.n, config.embed_dim, config.attention, config.position,
                            config.autoregressive, config.additive_hidden, config.position_scale,
                            config.readout_init, config.normalizer)


def argmax_on_p2(weights: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Fraction of the rows n + i of ``weights`` [B, 2n, 2n] whose largest weight is on input
    position p₂[i], the place where p₃[i] = p₁[p₂[i]] is read from."""
    n = inputs.shape[1] // 2
    return (weights[:, n:].argmax(-1) == inputs[:, n:]).float().mean()


def answer_rows_allowed(n: int, autoregressive: bool, device=None) -> torch.Tensor | None:
    """The positions the answer rows n..2n−1 (the queries whose outputs are predicted) may
    attend to, [n, 2n] boolean: all of them, or with ``autoregressive`` the keys j <= n + i
    (None when nothing is masked)."""
    if not autoregressive:
        return None
    return autoregressive_mask(2 * n, device)[n:]


def make_task(config: PermutationConfig, device: str | torch.device | None = None) -> Task:
    """Permutation composition: fixed validation and test sequences and fresh training batches
    drawn on the CPU, the model built there from the seed, then moved to ``device``."""
    n = config.n
    splits = {name: permutation_batch(size, n, torch.Generator().manual_seed(seed))
              for name, size, seed in (("val", config.val_size, 10_000 + config.train.seed),
                                       ("test", config.test_size, 20_000 + config.train.seed))}
    torch.manual_seed(config.train.seed)
    model = make_model(config)
    if device is not None:
        model.to(device)

    def train_batches(epoch, generator):  # fresh sequences for every batch
        for _ in range(config.batches_per_epoch):
            yield permutation_batch(config.batch_size, n, generator)

    def loss(logits, targets):  # only the p₃ half is predicted
        return F.cross_entropy(logits[:, n:].reshape(-1, n), targets[:, n:].reshape(-1))

    @torch.no_grad()
    def evaluate_sums(model, split, rank=0, world_size=1):
        model.eval()
        device = model_device(model)
        inputs, targets = (part[rank::world_size].to(device) for part in splits[split])
        correct = agree = 0.0
        zeros = weights = 0
        allowed = answer_rows_allowed(n, config.autoregressive, device)
        for chunk_in, chunk_target in zip(inputs.split(1000), targets.split(1000)):
            if len(chunk_in) == 0:  # a share of a split smaller than the processes
                break
            logits = model(chunk_in)
            correct += (logits[:, n:].argmax(-1) == chunk_target[:, n:]).sum().item()
            maps = model.attention.last_weights
            agree += argmax_on_p2(maps, chunk_in).item() * len(chunk_in)
            chunk_zeros, chunk_weights = attention_zero_counts([maps[:, n:]], allowed)
            zeros, weights = zeros + chunk_zeros, weights + chunk_weights
        return {"accuracy": (correct, len(inputs) * n), "argmax_on_p2": (agree, len(inputs)),
                "attention_zero_fraction": (zeros, weights)}

    def evaluate(model, split):
        return {name: numerator / denominator
                for name, (numerator, denominator) in evaluate_sums(model, split).items()}

    def accuracy(logits, targets):  # per element of the p₃ half
        return (logits[:, n:].argmax(-1) == targets[:, n:]).float().mean()

    return Task(name=f"permutation ({config.variant})", model=model,
                train_batches=train_batches, batches_per_epoch=config.batches_per_epoch,
                loss=loss, evaluate=evaluate, accuracy=accuracy, evaluate_sums=evaluate_sums,
                examples={"attention": splits["test"][0][:1]})


def attention_example(task: Task):
    """(maps, tokens) of one test sequence: [the [1, 1, 2n, 2n] map] (on the CPU), and its
    digits."""
    inputs = task.examples["attention"]
    weights = task.model.attention_map(inputs.to(model_device(task.model))).cpu()
    return [weights.unsqueeze(1)], [str(d) for d in inputs[0].tolist()]


def marked_attention_figure(model: PermutationModel, inputs: torch.Tensor,
                            title: str | None = None):
    """The attention map of the sequence ``inputs`` [2n], the cells (n + i, p₂[i]) framed."""
    n = inputs.shape[0] // 2
    weights = model.attention_map(inputs.unsqueeze(0).to(model_device(model)))[0].cpu()
    inputs = inputs.cpu()
    cells = [(n + i, int(inputs[n + i])) for i in range(n)]
    tokens = [str(d) for d in inputs.tolist()]
    return plot.attention_map(weights, tokens, tokens, marked=cells, title=title)


def extra_figures(task: Task) -> dict:
    """{"attention_p2": the test example's map with the cells (n + i, p₂[i]) framed}."""
    return {"attention_p2": marked_attention_figure(
        task.model, task.examples["attention"][0],
        title="framed: (n + i, p₂[i]), where p₃[i] = p₁[p₂[i]] is read")}


def apply_options(config: PermutationConfig, args) -> PermutationConfig:
    """The command line's --attention, --position and --autoregressive."""
    chosen = {name: getattr(args, name) for name in ("attention", "position", "autoregressive",
                                                     "readout_init")
              if getattr(args, name, None) is not None}
    return dataclasses.replace(config, **chosen)


def run_name(config: PermutationConfig) -> str:
    """The default output folder's name: one per variant, so runs do not resume each other."""
    return f"permutation-{config.variant}"
