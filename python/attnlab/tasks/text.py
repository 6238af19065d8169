"""Text classification (the NYU self-attention notebook): sentiment of movie reviews read from an ``aclImdb`` folder.
Word and position embeddings, encoder layers built on the cross-style multi-head attention, a
max-pool over the sequence and a linear layer to two classes.

Two recipes (``TextConfig.recipe``):

- ``"nyu"``, the notebook's own: the position table holds the sinusoids and is frozen, no
  dropout anywhere (the notebook's ``p`` arguments are never used), no padding mask (padding
  tokens are attended to and pooled over like words), length-bucketed batches, AdamW at a
  constant learning rate without gradient clipping.
- ``"improved"`` (the default), attnlab's: the position table starts at the sinusoids and is
  learned, dropout 0.1, padding masked out as keys and left out of the max-pool, shuffled
  batches, the cosine warm-up schedule and gradient clipping at 5 of the shared loop.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data import IMDB_LABELS, IMDB_SPLITS, load_imdb
from ..nn import MultiHeadAttention, sinusoidal_embedding
from ..train import Task, TrainConfig, model_device

UNKNOWN, PADDING = 0, 1  # the two special tokens, before the words
SPECIALS = ("<unk>", "<pad>")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)*")
_LINE_BREAK = re.compile(r"<br\s*/?>")  # IMDB reviews keep their HTML line breaks


def tokenize(text: str) -> list[str]:
    """Lower-cased words (letters and digits, inner apostrophes kept: "don't"); punctuation and
    the reviews' <br /> tags are dropped."""
    return _WORD.findall(_LINE_BREAK.sub(" ", text.lower()))


class Vocabulary:
    """The ``size`` most frequent words of the training texts after the two specials: index 0
    is the unknown word, index 1 padding. Ties are broken alphabetically, so the vocabulary
    does not depend on the order of the files."""

    def __init__(self, words: Sequence[str]):
        self.words = list(SPECIALS) + list(words)
        self.index = {word: i for i, word in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise ValueError("the vocabulary's words must be distinct and not special tokens")

    @classmethod
    def build(cls, tokenized: Iterable[list[str]], size: int) -> "Vocabulary":
        if size < 1:
            raise ValueError(f"size (the vocabulary size) must be at least 1, got {size}")
        counts = Counter(word for tokens in tokenized for word in tokens)
        return cls(sorted(counts, key=lambda word: (-counts[word], word))[:size])

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokenized: Sequence[list[str]], length: int) -> torch.Tensor:
        """[len(tokenized), length] int64: each text cut or padded to ``length`` tokens. An
        empty text becomes one unknown token, so every row has something to pool over."""
        if length < 1:
            raise ValueError(f"length must be at least 1, got {length}")
        ids = torch.full((len(tokenized), length), PADDING, dtype=torch.long)
        for row, tokens in enumerate(tokenized):
            codes = [self.index.get(word, UNKNOWN) for word in tokens[:length]] or [UNKNOWN]
            ids[row, :len(codes)] = torch.tensor(codes)
        return ids

    def decode(self, ids: torch.Tensor) -> list[str]:
        return [self.words[i] for i in ids.tolist()]


class TextEncoderLayer(nn.Module):
    """Post-norm: x = LayerNorm(x + Dropout(MHA(x, x, x))), x = LayerNorm(x + Dropout(FFN(x)))
    with FFN = Linear → ReLU → Linear and eps = 1e-6, as in the NYU notebook."""

    def __init__(self, d_model: int, num_heads: int, ff_dim: int, dropout: float):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, num_heads, dropout)
        self.feed_forward = nn.Sequential(nn.Linear(d_model, ff_dim), nn.ReLU(),
                                          nn.Linear(ff_dim, d_model))
        self.norm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.norm2 = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """x [B, L, d_model] → (x, attention [B, H, L, L])"""
        attended, weights = self.attention(x, x, x, mask=mask)
        x = self.norm1(x + self.dropout(attended))
        return self.norm2(x + self.dropout(self.feed_forward(x))), weights


class TextClassifier(nn.Module):
    """Token embedding (padding index 1) + a position table started at the sinusoids,
    LayerNorm (eps 1e-12), encoder layers, max-pool over the sequence, Linear to the classes.

    ``freeze_positions`` keeps the position table at the sinusoids (the NYU notebook), else it
    is learned. ``mask_padding`` masks padding positions out as keys and leaves them out of the
    max-pool; without it (the notebook) they are attended to and pooled like any token."""

    def __init__(self, vocab_size: int, d_model: int = 32, num_heads: int = 2,
                 ff_dim: int = 128, num_layers: int = 1, max_positions: int = 10_000,
                 dropout: float = 0.1, num_classes: int = 2, freeze_positions: bool = False,
                 mask_padding: bool = True):
        super().__init__()
        if vocab_size <= PADDING:
            raise ValueError(f"vocab_size must count the two special tokens, got {vocab_size}")
        self.mask_padding = mask_padding
        self.token_embedding = nn.Embedding(vocab_size, d_model, padding_idx=PADDING)
        self.position_embedding = sinusoidal_embedding(max_positions, d_model)
        self.position_embedding.weight.requires_grad_(not freeze_positions)
        self.embedding_norm = nn.LayerNorm(d_model, eps=1e-12)
        self.layers = nn.ModuleList(TextEncoderLayer(d_model, num_heads, ff_dim, dropout)
                                    for _ in range(num_layers))
        self.classifier = nn.Linear(d_model, num_classes)

    def _encode(self, ids: torch.Tensor):
        if ids.dim() != 2 or ids.dtype != torch.long:
            raise ValueError(f"ids must be an int64 tensor [batch, length], got {ids.dtype} of "
                             f"shape {list(ids.shape)}")
        if ids.shape[1] > self.position_embedding.num_embeddings:
            raise ValueError(f"sequences of {ids.shape[1]} tokens exceed the "
                             f"{self.position_embedding.num_embeddings} positions of the model")
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.embedding_norm(self.token_embedding(ids) + self.position_embedding(positions))
        keep = (ids != PADDING if self.mask_padding      # [B, L]
                else torch.ones_like(ids, dtype=torch.bool))
        mask = keep[:, None, None, :] if self.mask_padding else None  # [B, 1, 1, L] or none
        maps = []
        for layer in self.layers:
            x, weights = layer(x, mask)
            maps.append(weights)
        return x, keep, maps

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, L] → logits [B, num_classes]"""
        x, keep, _ = self._encode(ids)
        pooled = x.masked_fill(~keep[..., None], float("-inf")).amax(1)   # [B, d_model]
        return self.classifier(pooled)

    @torch.no_grad()
    def get_attention_maps(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """One [B, H, L, L] map per layer."""
        return self._encode(ids)[2]


RECIPES = ("improved", "nyu")


@dataclass
class TextConfig:
    """The experiment's setting; ``recipe`` as the module docstring describes ("nyu" sets the
    dropout to 0, and a constant learning rate without clipping, whatever ``dropout`` and
    ``train`` say)."""

    data: str | None = None          # the aclImdb folder; None: a clear error
    recipe: str = "improved"         # or "nyu", the notebook's own
    vocab_size: int = 50_000
    max_len: int = 200
    model_dim: int = 32
    num_heads: int = 2
    ff_dim: int = 128
    num_layers: int = 1
    dropout: float = 0.1
    max_positions: int = 10_000
    batch_size: int = 164
    val_fraction: float = 0.1
    train: TrainConfig = field(default_factory=lambda: TrainConfig(
        epochs=10, lr=1e-3, warmup=50, grad_clip=5.0, optimizer="adamw"))

    def __post_init__(self):
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {', '.join(RECIPES)}, got {self.recipe!r}")
        if self.recipe == "nyu":  # the notebook's: no dropout, constant rate, no clipping
            self.dropout = 0.0
            self.train = dataclasses.replace(self.train, schedule="constant", grad_clip=None)
        for name in ("vocab_size", "max_len", "model_dim", "num_heads", "ff_dim", "num_layers",
                     "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_len > self.max_positions:
            raise ValueError(f"max_len ({self.max_len}) must not exceed max_positions "
                             f"({self.max_positions})")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"val_fraction must be between 0 and 1, got {self.val_fraction}")


def default_config(seed: int = 0, recipe: str = "improved") -> TextConfig:
    """The NYU notebook's model, sizes and optimizer, with ``recipe``'s training details."""
    return TextConfig(recipe=recipe, train=dataclasses.replace(TextConfig().train, seed=seed))


def fast_config(seed: int = 0, recipe: str = "improved") -> TextConfig:
    """The same model for 2 epochs over reviews cut to 100 tokens."""
    return TextConfig(max_len=100, recipe=recipe,
                      train=dataclasses.replace(TextConfig().train, epochs=2, seed=seed))


def bucketed_batches(lengths: torch.Tensor, batch_size: int, generator: torch.Generator,
                     pool_batches: int = 100) -> list[torch.Tensor]:
    """Length-bucketed batches, as torchtext's BucketIterator makes them: the rows are
    shuffled, each pool of ``pool_batches`` batches is sorted by length and cut into batches,
    and the batches are shuffled. Returns the row indices of each batch (the last may be
    short)."""
    order = torch.randperm(len(lengths), generator=generator)
    pool = batch_size * pool_batches
    batches = []
    for start in range(0, len(order), pool):
        chunk = order[start:start + pool]
        chunk = chunk[lengths[chunk].argsort(stable=True)]
        batches.extend(chunk.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def make_task(config: TextConfig, device: str | torch.device | None = None) -> Task:
    """Sentiment classification: the corpus read and encoded on the CPU, the model built there
    from the seed, then moved to ``device``."""
    corpus = load_imdb(config.data)
    texts, labels = corpus["train"]
    if len(texts) < 2:
        raise ValueError(f"{config.data}: the training split needs at least 2 reviews to hold "
                         f"some out for validation, got {len(texts)}")
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(config.train.seed))
    held_out = min(max(1, round(config.val_fraction * len(texts))), len(texts) - 1)
    parts = {"val": order[:held_out], "train": order[held_out:]}
    tokenized = [tokenize(text) for text in texts]
    vocabulary = Vocabulary.build((tokenized[i] for i in parts["train"].tolist()),
                                  config.vocab_size)
    splits = {name: (vocabulary.encode([tokenized[i] for i in rows.tolist()], config.max_len),
                     labels[rows]) for name, rows in parts.items()}
    splits["test"] = (vocabulary.encode([tokenize(t) for t in corpus["test"][0]], config.max_len),
                      corpus["test"][1])
    torch.manual_seed(config.train.seed)
    nyu = config.recipe == "nyu"
    model = TextClassifier(len(vocabulary), config.model_dim, config.num_heads, config.ff_dim,
                           config.num_layers, config.max_positions, config.dropout,
                           freeze_positions=nyu, mask_padding=not nyu)
    if device is not None:
        model.to(device)
    train_size = len(parts["train"])
    batches = math.ceil(train_size / config.batch_size)  # the last, partial batch is kept

    lengths = (splits["train"][0] != PADDING).sum(1)

    def train_batches(epoch, generator):
        if nyu:
            for rows in bucketed_batches(lengths, config.batch_size, generator):
                yield splits["train"][0][rows], splits["train"][1][rows]
            return
        shuffled = torch.randperm(train_size, generator=generator)
        for b in range(batches):
            rows = shuffled[b * config.batch_size:(b + 1) * config.batch_size]
            yield splits["train"][0][rows], splits["train"][1][rows]

    @torch.no_grad()
    def evaluate_sums(model, split, rank=0, world_size=1):
        model.eval()
        device = model_device(model)
        ids, targets = (part[rank::world_size].to(device) for part in splits[split])
        correct = sum((model(chunk).argmax(-1) == target).sum().item()
                      for chunk, target in zip(ids.split(1000), targets.split(1000)) if len(chunk))
        return {"accuracy": (correct, len(ids))}

    def evaluate(model, split):
        correct, total = evaluate_sums(model, split)["accuracy"]
        return {"accuracy": correct / total}

    def accuracy(logits, targets):
        return (logits.argmax(-1) == targets).float().mean()

    return Task(name="text" if not nyu else "text (nyu recipe)", model=model, train_batches=train_batches, batches_per_epoch=batches,
                loss=F.cross_entropy, evaluate=evaluate, accuracy=accuracy,
                evaluate_sums=evaluate_sums,
                examples={"vocabulary": vocabulary, "test_ids": splits["test"][0],
                          "test_labels": splits["test"][1]})


def attention_example(task: Task, shown: int = 24):
    """(maps, tokens) of the first ``shown`` tokens of the first test review, run on their own
    so the map stays readable: one [1, H, shown, shown] map per layer, and the words."""
    ids = task.examples["test_ids"][:1]
    ids = ids[:, :min(shown, int((ids != PADDING).sum()))]
    maps = task.model.get_attention_maps(ids.to(model_device(task.model)))
    return [m.cpu() for m in maps], task.examples["vocabulary"].decode(ids[0])


POSITIVE_WORDS = ("great", "wonderful", "superb", "brilliant", "moving", "delightful",
                  "excellent", "charming")
NEGATIVE_WORDS = ("awful", "boring", "dreadful", "terrible", "dull", "clumsy", "tedious",
                  "poor")
NEUTRAL_WORDS = ("the", "a", "film", "movie", "plot", "story", "actor", "actress", "scene",
                 "director", "music", "ending", "camera", "character", "and", "was", "is", "of",
                 "this", "with", "it", "in", "script", "role", "cast", "screen", "minutes",
                 "dialogue", "sequel", "hour", "we", "watched", "on", "friday", "cinema", "my")


def write_demo_corpus(root: str | Path, reviews_per_label: int = 100, seed: int = 0) -> Path:
    """Writes a small corpus in the aclImdb layout (train|test / pos|neg / <i>_<rating>.txt)
    whose classes are clearly separable: every review is neutral filler with five words from
    its own class's word set. For tests and demonstrations where IMDB is not at hand."""
    if reviews_per_label < 1:
        raise ValueError(f"reviews_per_label must be at least 1, got {reviews_per_label}")
    root, rng = Path(root), random.Random(seed)
    for split in IMDB_SPLITS:
        for label, sentiment_words in zip(IMDB_LABELS, (NEGATIVE_WORDS, POSITIVE_WORDS)):
            folder = root / split / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(reviews_per_label):
                words = rng.choices(NEUTRAL_WORDS, k=rng.randint(20, 50))
                for word in rng.choices(sentiment_words, k=5):
                    words.insert(rng.randint(0, len(words)), word)
                rating = rng.randint(7, 10) if label == "pos" else rng.randint(1, 4)
                text = " ".join(words).capitalize() + ".<br /><br />" + rng.choice(NEUTRAL_WORDS)
                (folder / f"{i}_{rating}.txt").write_text(text, encoding="utf-8")
    return root


def apply_options(config: TextConfig, args) -> TextConfig:
    """The command line's --recipe."""
    recipe = getattr(args, "recipe", None)
    return config if recipe is None else dataclasses.replace(config, recipe=recipe)


def run_name(config: TextConfig) -> str:
    """The default output folder's name: text, or text-nyu for the notebook's recipe."""
    return "text" if config.recipe == "improved" else f"text-{config.recipe}"
