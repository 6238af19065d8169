"""The UvA DL tutorial "Transformers and Multi-Head Attention" under its own names.

Replace the tutorial's definitions with one import and the rest of the notebook runs unchanged:

    from attnlab.tutorials.uvadl import (scaled_dot_product, MultiheadAttention, EncoderBlock,
        TransformerEncoder, PositionalEncoding, CosineWarmupScheduler, TransformerPredictor,
        ReverseDataset, ReversePredictor, SetAnomalyDataset, AnomalyPredictor,
        plot_attention_maps, train_reverse, train_anomaly)

Everything computes through attnlab's operator (``attnlab.nn`` modules under the tutorial's
names, with the same parameter names, so the tutorial's checkpoints load).

**Mask convention (the tutorial's):** a query may not attend where ``mask == 0``, for a mask of
any dtype: a float ``torch.tril(torch.ones(L, L))`` is a causal mask here, and so are the same
ones as integers or booleans. Shapes ``[L, L]``, ``[B, L, L]`` or ``[B, H, L, L]``. Every class
and function of this module converts the mask at its boundary (``mask != 0``, attnlab's boolean
True = may attend); ``attnlab.nn`` itself would *add* a float mask to the scores.

**Differences that remain:**

- A query whose keys are all masked gets a zero output and zero weights; the tutorial fills the
  masked logits with -9e15 and so spreads uniform weights over all keys.
- ``get_attention_maps`` runs without autograd, as the tutorial's does.
- ``TransformerEncoder.get_attention_maps`` applies the mask in every layer (the tutorial's
  runs the layers after the first one without it).
- ``PositionalEncoding`` computes its table in float64 before rounding to float32 (the
  tutorial's float32 arithmetic differs by up to ~1e-4 at positions in the thousands).
- The Lightning modules build on ``lightning`` or on ``pytorch_lightning`` (see ``LIGHTNING``);
  ``configure_optimizers`` returns Adam with the cosine warm-up schedule stepped every batch by
  Lightning itself (the tutorial stepped it in an ``optimizer_step`` override).
- ``train_reverse``/``train_anomaly`` take the loaders and checkpoint folder as arguments and,
  when they are not given, read the notebook's globals as the tutorial's functions do.
"""

from __future__ import annotations

import importlib
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn
from torch.utils import data

from .. import nn as _attnlab_nn
from .. import plot as _plot
from ..functional import scaled_dot_product_attention as _attention
from ..models import TransformerPredictor as _CorePredictor
from ..nn import CosineWarmupScheduler, PositionalEncoding
from ._common import check_positive_int, check_tensor, from_notebook, show_or_return

__all__ = [
    "scaled_dot_product", "expand_mask", "to_attnlab_mask", "MultiheadAttention", "EncoderBlock",
    "TransformerEncoder", "PositionalEncoding", "CosineWarmupScheduler", "TransformerPredictor",
    "ReversePredictor", "AnomalyPredictor", "ReverseDataset", "SetAnomalyDataset",
    "plot_attention_maps", "visualize_exmp", "train_reverse", "train_anomaly",
    "seed_42_example", "LIGHTNING", "DATA_MEANS", "DATA_STD",
]

# ImageNet statistics, which the tutorial normalises its CIFAR images with.
DATA_MEANS = np.array([0.485, 0.456, 0.406])
DATA_STD = np.array([0.229, 0.224, 0.225])


# ---- masks -------------------------------------------------------------------------------------

def to_attnlab_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The tutorial's mask (a query may not attend where ``mask == 0``, any dtype) as attnlab's
    boolean mask (``True`` = may attend): ``mask != 0``. ``None`` stays ``None``; a boolean
    mask is returned unchanged in meaning, so converting twice is harmless."""
    if mask is None:
        return None
    check_tensor("mask", mask)
    if mask.is_complex():
        raise TypeError(f"mask must be real (0 = blocked), got dtype {mask.dtype}")
    return mask != 0


def expand_mask(mask: torch.Tensor) -> torch.Tensor:
    """A mask of shape ``[L, L]``, ``[B, L, L]`` or ``[B, H, L, L]`` as a 4-d mask
    ``[B or 1, H or 1, L, L]`` that broadcasts over batch and heads (values unchanged)."""
    check_tensor("mask", mask)
    if mask.dim() < 2 or mask.dim() > 4:
        raise ValueError(f"mask must have shape [L, L], [B, L, L] or [B, H, L, L], got "
                         f"{list(mask.shape)}")
    if mask.dim() == 3:
        mask = mask.unsqueeze(1)
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask


def scaled_dot_product(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q·kᵀ/√d_k) · v over the last two dimensions, through attnlab's operator.

    Args:
        q: queries ``[..., L_q, d_k]``.
        k: keys ``[..., L_k, d_k]``.
        v: values ``[..., L_k, d_v]``.
        mask: the tutorial's convention, a query may not attend where ``mask == 0`` (any dtype),
            broadcastable to ``[..., L_q, L_k]``.

    Returns:
        The pair ``(values, attention)`` in the tutorial's order: values ``[..., L_q, d_v]``
            and the weights ``[..., L_q, L_k]``. A query whose keys are all masked
            gets zeros in both (the tutorial gives it uniform weights).
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, tensor)
    return _attention(q, k, v, attn_mask=to_attnlab_mask(mask), need_weights=True)


def seed_42_example() -> dict:
    """The tutorial's worked example: ``torch.manual_seed(42)``, then q, k, v drawn with
    ``torch.randn(3, 2)`` in that order, and their scaled dot-product attention. Uses its own
    generator (seeded 42), so the global random state is left alone and the numbers are the
    tutorial's.

    Returns:
        A dict with the tensors ``q``, ``k``, ``v``, ``values`` and ``attention``.
    """
    generator = torch.Generator().manual_seed(42)
    seq_len, d_k = 3, 2
    q, k, v = (torch.randn(seq_len, d_k, generator=generator) for _ in range(3))
    values, attention = scaled_dot_product(q, k, v)
    return {"q": q, "k": k, "v": v, "values": values, "attention": attention}


# ---- modules -----------------------------------------------------------------------------------

class MultiheadAttention(_attnlab_nn.MultiheadAttention):
    """``MultiheadAttention(input_dim, embed_dim, num_heads)``: ``qkv_proj`` and ``o_proj`` as in
    the tutorial (Xavier-uniform weights, zero biases), ``forward(x, mask=None,
    return_attention=False)`` returning ``o`` or ``(o, attention)``. The mask follows the
    tutorial (``mask == 0`` blocked)."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                return_attention: bool = False):
        """x ``[B, L, input_dim]`` → ``o`` ``[B, L, embed_dim]``, or ``(o, attention)`` with
        attention ``[B, H, L, L]`` when ``return_attention``."""
        return super().forward(x, mask=to_attnlab_mask(mask), return_attention=return_attention)


class EncoderBlock(_attnlab_nn.EncoderBlock):
    """``EncoderBlock(input_dim, num_heads, dim_feedforward, dropout=0.0)``, post-norm:
    ``x = norm1(x + dropout(self_attn(x)))``, ``x = norm2(x + dropout(linear_net(x)))``, with the
    tutorial's submodule names. The mask follows the tutorial (``mask == 0`` blocked)."""

    def __init__(self, input_dim: int, num_heads: int, dim_feedforward: int,
                 dropout: float = 0.0):
        super().__init__(input_dim, num_heads, dim_feedforward, dropout=dropout)
        _adopt(self)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[B, L, input_dim]`` → ``[B, L, input_dim]``."""
        return super().forward(x, mask=to_attnlab_mask(mask))


class TransformerEncoder(_attnlab_nn.TransformerEncoder):
    """``TransformerEncoder(num_layers, **block_args)``: ``layers`` of EncoderBlocks, ``forward(x,
    mask=None)`` and ``get_attention_maps(x, mask=None)`` (one ``[B, H, L, L]`` map per
    layer). The mask follows the tutorial (``mask == 0`` blocked)."""

    def __init__(self, num_layers: int, **block_args):
        super().__init__(num_layers, **block_args)
        _adopt(self)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x ``[B, L, d]`` through every layer."""
        return super().forward(x, mask=to_attnlab_mask(mask))

    @torch.no_grad()
    def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """One attention map ``[B, H, L, L]`` per layer for the input x (the mask is applied in
        every layer)."""
        return super().get_attention_maps(x, mask=to_attnlab_mask(mask))


_TUTORIAL_CLASSES = {_attnlab_nn.MultiheadAttention: MultiheadAttention,
                     _attnlab_nn.EncoderBlock: EncoderBlock,
                     _attnlab_nn.TransformerEncoder: TransformerEncoder}


def _adopt(module: nn.Module) -> nn.Module:
    """Gives the attnlab.nn attention modules inside ``module`` (itself included) this module's
    mask convention, in place. The subclasses above add no state, only the conversion of the
    mask, so swapping the class keeps every weight (and the random draws of their
    initialisation, which match the tutorial's)."""
    for child in module.modules():
        tutorial_class = _TUTORIAL_CLASSES.get(type(child))
        if tutorial_class is not None:
            child.__class__ = tutorial_class
    return module


# ---- data --------------------------------------------------------------------------------------

class ReverseDataset(data.Dataset):
    """``ReverseDataset(num_categories, seq_len, size)``: ``size`` sequences of ``seq_len``
    integers in [0, num_categories), drawn once from torch's global generator; item ``idx``
    is ``(inp_data, labels)`` with labels = the sequence reversed."""

    def __init__(self, num_categories: int, seq_len: int, size: int):
        super().__init__()
        self.num_categories = check_positive_int("num_categories", num_categories, 1)
        self.seq_len = check_positive_int("seq_len", seq_len, 1)
        self.size = check_positive_int("size", size, 1)
        self.data = torch.randint(self.num_categories, size=(self.size, self.seq_len))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx):
        inp_data = self.data[idx]
        return inp_data, torch.flip(inp_data, dims=(0,))


class SetAnomalyDataset(data.Dataset):
    """``SetAnomalyDataset(img_feats, labels, set_size=10, train=True)``: item ``idx`` is a set
    of ``set_size`` feature vectors, ``set_size − 1`` images of one class chosen uniformly
    among the other classes followed by image ``idx`` (the anomaly, always last), returned as
    ``(img_set, indices, label)`` with label = ``set_size − 1``.

    Training sets are drawn afresh at every access from numpy's global generator; test sets
    (``train=False``) are drawn once, in ``__init__``, from a generator seeded 42 (the
    tutorial's ``np.random.seed(42)``, without changing numpy's global state). As in the
    tutorial every class must hold the same number of images (``img_idx_by_label`` is
    ``[classes, images per class]``); ``self.set_size`` is the number of normal images."""

    def __init__(self, img_feats: torch.Tensor, labels: torch.Tensor, set_size: int = 10,
                 train: bool = True):
        super().__init__()
        check_tensor("img_feats", img_feats)
        check_tensor("labels", labels)
        if img_feats.dim() != 2:
            raise ValueError(f"img_feats must be [num_imgs, img_dim], got {list(img_feats.shape)}")
        if labels.dim() != 1 or len(labels) != len(img_feats) or labels.is_floating_point():
            raise ValueError(f"labels must be integer class labels [num_imgs] = "
                             f"[{len(img_feats)}], got {labels.dtype} {list(labels.shape)}")
        check_positive_int("set_size", set_size, 2)
        self.img_feats, self.labels, self.train = img_feats, labels.long(), train
        self.set_size = set_size - 1  # the number of images of the set's class
        counts = torch.bincount(self.labels)
        self.num_labels = len(counts)
        if self.num_labels < 2 or bool((counts != counts[0]).any()):
            raise ValueError(f"labels must cover at least two classes 0..C-1 with the same number "
                             f"of images each, got counts {counts.tolist()}")
        if int(counts[0]) < self.set_size:
            raise ValueError(f"each class has {int(counts[0])} images, fewer than the "
                             f"{self.set_size} a set of size {set_size} needs")
        # torch's default sort, as the tutorial's: its order among equal labels decides which
        # images make up each fixed test set.
        self.img_idx_by_label = torch.argsort(self.labels).reshape(self.num_labels, -1)
        if not train:
            self.test_sets = self._create_test_sets()

    def _create_test_sets(self) -> torch.Tensor:
        """The fixed sets of a test dataset: ``[num_imgs, set_size − 1]`` image indices."""
        generator = np.random.RandomState(42)
        return torch.stack([self.sample_img_set(self.labels[idx], generator)
                            for idx in range(len(self.img_feats))])

    def sample_img_set(self, anomaly_label, generator=None) -> torch.Tensor:
        """Indices of ``set_size − 1`` distinct images of a class other than ``anomaly_label``
        (numpy's global generator unless ``generator`` is given)."""
        generator = np.random if generator is None else generator
        set_label = generator.randint(self.num_labels - 1)
        if set_label >= int(anomaly_label):
            set_label += 1
        chosen = generator.choice(self.img_idx_by_label.shape[1], size=self.set_size,
                                  replace=False)
        return self.img_idx_by_label[set_label, torch.from_numpy(chosen)]

    def __len__(self) -> int:
        return self.img_feats.shape[0]

    def __getitem__(self, idx):
        img_indices = self.sample_img_set(self.labels[idx]) if self.train else self.test_sets[idx]
        img_set = torch.cat([self.img_feats[img_indices], self.img_feats[idx][None]], dim=0)
        indices = torch.cat([img_indices, torch.tensor([idx], dtype=torch.long)], dim=0)
        return img_set, indices, img_set.shape[0] - 1


# ---- plots -------------------------------------------------------------------------------------

def plot_attention_maps(input_data, attn_maps, idx: int = 0, show: bool = True) -> Figure | None:
    """The attention maps of example ``idx``: rows = layers, columns = heads, query on the y
    axis (``origin="lower"``), tick labels = the input tokens (``input_data[idx]``, or the
    positions when ``input_data`` is None).

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    if len(attn_maps) == 0:
        raise ValueError("attn_maps must hold at least one layer's map [B, H, L, L]")
    if input_data is None:
        tokens = [str(i) for i in range(attn_maps[0].shape[-1])]
    else:
        tokens = [str(t) for t in torch.as_tensor(input_data)[idx].detach().cpu().tolist()]
    return show_or_return(_plot.attention_grid(attn_maps, tokens, index=idx), show)


def visualize_exmp(indices: torch.Tensor, orig_dataset, mean=DATA_MEANS, std=DATA_STD,
                   show: bool = True) -> Figure | None:
    """The images of the sets ``indices`` ``[sets, set_size]`` from ``orig_dataset`` (items
    ``(image [C, H, W], label)``, normalised with ``mean``/``std``), one set per row, the
    anomaly last.

    Returns:
        None when ``show`` (the figure is displayed in a notebook), else the Figure.
    """
    indices = torch.as_tensor(indices)
    if indices.dim() != 2 or indices.numel() == 0:
        raise ValueError(f"indices must be [sets, set_size], got {list(indices.shape)}")
    sets, size = indices.shape
    fig = Figure(figsize=(1.2 * size, 1.3 * sets + 0.4), layout="constrained")
    axes = fig.subplots(sets, size, squeeze=False)
    mean_t = torch.as_tensor(np.asarray(mean), dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.as_tensor(np.asarray(std), dtype=torch.float32).view(-1, 1, 1)
    for row in range(sets):
        for column in range(size):
            image = torch.as_tensor(orig_dataset[int(indices[row, column])][0]).float()
            image = (image * std_t + mean_t).clamp(0, 1) if image.dim() == 3 else image
            ax = axes[row][column]
            if image.dim() == 3 and image.shape[0] == 3:
                ax.imshow(image.permute(1, 2, 0).numpy())
            else:
                ax.imshow(image.reshape(image.shape[-2:]).numpy(), cmap="gray")
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle("Anomaly examples (the anomaly is last)")
    return show_or_return(fig, show)


# ---- Lightning ---------------------------------------------------------------------------------

def _choose_lightning():
    """The Lightning package the Lightning modules build on. A Trainer only accepts modules of
    its own package, so: the one named by ``ATTNLAB_LIGHTNING`` (``lightning`` or
    ``pytorch_lightning``) if set; else the one the notebook has already imported (the
    tutorial imports ``pytorch_lightning as pl`` in its older version, ``lightning as L`` in
    the newer); else ``lightning``, else ``pytorch_lightning``; None if neither is installed."""
    names = ("lightning", "pytorch_lightning")
    forced = os.environ.get("ATTNLAB_LIGHTNING")
    if forced:
        if forced not in names:
            raise ImportError(f"ATTNLAB_LIGHTNING must be 'lightning' or 'pytorch_lightning', "
                              f"got {forced!r}")
        return importlib.import_module(forced)
    loaded = [name for name in names if name in sys.modules]
    for name in loaded + [name for name in names if name not in loaded]:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


LIGHTNING = _choose_lightning()
"""The Lightning package (``lightning`` or ``pytorch_lightning``) that ``TransformerPredictor``
and its subclasses build on; use its ``Trainer``. None when neither is installed."""

if LIGHTNING is not None:
    _ModelCheckpoint = LIGHTNING.pytorch.callbacks.ModelCheckpoint \
        if hasattr(LIGHTNING, "pytorch") else LIGHTNING.callbacks.ModelCheckpoint

    class TransformerPredictor(LIGHTNING.LightningModule):
        """``TransformerPredictor(input_dim, model_dim, num_classes, num_heads, num_layers, lr,
        warmup, max_iters, dropout=0.0, input_dropout=0.0)``: ``input_net`` (Dropout → Linear),
        ``positional_encoding``, ``transformer`` (encoder, d_ff = 2·model_dim), ``output_net``
        (Linear → LayerNorm → ReLU → Dropout → Linear), built by attnlab's
        ``models.TransformerPredictor`` with the tutorial's names. Adam with the cosine warm-up
        schedule stepped every batch. Subclasses define the training, validation and test
        steps (``ReversePredictor``, ``AnomalyPredictor``)."""

        def __init__(self, input_dim: int, model_dim: int, num_classes: int, num_heads: int,
                     num_layers: int, lr: float, warmup: int, max_iters: int,
                     dropout: float = 0.0, input_dropout: float = 0.0):
            super().__init__()
            if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
                raise ValueError(f"lr must be a positive number, got {lr!r}")
            check_positive_int("warmup", warmup)
            check_positive_int("max_iters", max_iters)
            self.save_hyperparameters()
            self._create_model()

        def _create_model(self):
            hparams = self.hparams
            core = _CorePredictor(hparams.input_dim, hparams.model_dim, hparams.num_classes,
                                  hparams.num_heads, hparams.num_layers, dropout=hparams.dropout,
                                  input_dropout=hparams.input_dropout, positional_encoding=True)
            self.input_net = core.input_net
            self.positional_encoding = core.positional_encoding
            self.transformer = _adopt(core.transformer)
            self.output_net = core.output_net

        def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                    add_positional_encoding: bool = True) -> torch.Tensor:
            """x ``[B, L, input_dim]`` → ``[B, L, num_classes]``; ``mask`` in the tutorial's
            convention (``mask == 0`` blocked); no positional encoding for sets."""
            x = self.input_net(x)
            if add_positional_encoding:
                x = self.positional_encoding(x)
            return self.output_net(self.transformer(x, mask=mask))

        @torch.no_grad()
        def get_attention_maps(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                               add_positional_encoding: bool = True):
            """One ``[B, H, L, L]`` attention map per layer, for the same arguments as
            ``forward``."""
            x = self.input_net(x)
            if add_positional_encoding:
                x = self.positional_encoding(x)
            return self.transformer.get_attention_maps(x, mask=mask)

        def configure_optimizers(self):
            """Adam at ``lr`` with ``CosineWarmupScheduler(warmup, max_iters)``, stepped every
            batch (kept as ``self.lr_scheduler`` too, as in the tutorial)."""
            optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            self.lr_scheduler = CosineWarmupScheduler(optimizer, warmup=self.hparams.warmup,
                                                      max_iters=self.hparams.max_iters)
            return [optimizer], [{"scheduler": self.lr_scheduler, "interval": "step"}]

        def training_step(self, batch, batch_idx):
            """Defined by the task's subclass."""
            raise NotImplementedError

        def validation_step(self, batch, batch_idx):
            """Defined by the task's subclass."""
            raise NotImplementedError

        def test_step(self, batch, batch_idx):
            """Defined by the task's subclass."""
            raise NotImplementedError

    class _LossSteps:
        """Training, validation and test steps of a task whose ``_calculate_loss(batch, mode)``
        returns ``(loss, acc)``, as both of the tutorial's tasks define them."""

        def training_step(self, batch, batch_idx):
            """The training loss of one batch."""
            return self._calculate_loss(batch, mode="train")[0]

        def validation_step(self, batch, batch_idx):
            """Logs ``val_loss`` and ``val_acc``."""
            self._calculate_loss(batch, mode="val")

        def test_step(self, batch, batch_idx):
            """Logs ``test_loss`` and ``test_acc``."""
            self._calculate_loss(batch, mode="test")

    class ReversePredictor(_LossSteps, TransformerPredictor):
        """Sequence reversal: batches ``(inp_data, labels)`` of integer sequences, one-hot
        encoded inside, cross-entropy over every position; logs ``{mode}_loss`` and
        ``{mode}_acc``."""

        def _calculate_loss(self, batch, mode: str = "train"):
            """``(loss, acc)`` of one batch, logged under ``mode``."""
            inp_data, labels = batch
            inp_data = F.one_hot(inp_data, num_classes=self.hparams.num_classes).float()
            preds = self.forward(inp_data, add_positional_encoding=True)
            loss = F.cross_entropy(preds.view(-1, preds.size(-1)), labels.view(-1))
            acc = (preds.argmax(dim=-1) == labels).float().mean()
            self.log(f"{mode}_loss", loss)
            self.log(f"{mode}_acc", acc)
            return loss, acc

    class AnomalyPredictor(_LossSteps, TransformerPredictor):
        """Set anomaly detection: batches ``(img_sets, indices, labels)``, no positional
        encoding (a set), one logit per element and the cross-entropy of the softmax over the
        set; logs ``{mode}_loss`` and ``{mode}_acc`` (the latter per epoch)."""

        def _calculate_loss(self, batch, mode: str = "train"):
            """``(loss, acc)`` of one batch, logged under ``mode``."""
            img_sets, _, labels = batch
            preds = self.forward(img_sets, add_positional_encoding=False).squeeze(dim=-1)
            loss = F.cross_entropy(preds, labels)
            acc = (preds.argmax(dim=-1) == labels).float().mean()
            self.log(f"{mode}_loss", loss)
            self.log(f"{mode}_acc", acc, on_step=False, on_epoch=True)
            return loss, acc

_LIGHTNING_NAMES = ("TransformerPredictor", "ReversePredictor", "AnomalyPredictor")


def __getattr__(name):
    if name in _LIGHTNING_NAMES:
        raise ImportError(f"attnlab.tutorials.uvadl.{name} needs Lightning: pip install lightning")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _train(task_class, pretrained_name, folder, train_loader, val_loader, evaluations,
           checkpoint_path, max_epochs, gradient_clip_val, trainer_args, reload_best, model_args,
           function):
    checkpoint_path = from_notebook("CHECKPOINT_PATH", checkpoint_path, function)
    root_dir = os.path.join(checkpoint_path, folder)
    os.makedirs(root_dir, exist_ok=True)
    options = dict(default_root_dir=root_dir, accelerator="auto", devices=1,
                   max_epochs=max_epochs, gradient_clip_val=gradient_clip_val,
                   callbacks=[_ModelCheckpoint(save_weights_only=True, mode="max",
                                               monitor="val_acc")])
    options.update(trainer_args or {})
    trainer = LIGHTNING.Trainer(**options)
    if trainer.logger is not None and hasattr(trainer.logger, "_default_hp_metric"):
        trainer.logger._default_hp_metric = None
    pretrained = os.path.join(checkpoint_path, pretrained_name)
    if os.path.isfile(pretrained):
        print("Found pretrained model, loading...")
        model = task_class.load_from_checkpoint(pretrained)
    else:
        per_epoch, limit = len(train_loader), trainer.limit_train_batches
        if isinstance(limit, int):
            per_epoch = min(per_epoch, limit)
        elif isinstance(limit, float):
            per_epoch = max(1, int(per_epoch * limit))
        model = task_class(max_iters=trainer.max_epochs * per_epoch, **model_args)
        trainer.fit(model, train_loader, val_loader)
        best = getattr(trainer.checkpoint_callback, "best_model_path", "")
        if reload_best and best:
            model = task_class.load_from_checkpoint(best)
    results = {name: trainer.test(model, dataloaders=loader, verbose=False)[0]["test_acc"]
               for name, loader in evaluations}
    device = from_notebook("device", None, function, default=None)
    if device is not None:
        model = model.to(device)
    return model, results


def _need_lightning(function: str) -> None:
    if LIGHTNING is None:
        raise ImportError(f"{function} needs Lightning: pip install lightning")


def train_reverse(train_loader=None, val_loader=None, test_loader=None, checkpoint_path=None,
                  max_epochs: int = 10, trainer_args: dict | None = None,
                  **kwargs) -> tuple[nn.Module, dict]:
    """The tutorial's ``train_reverse(**kwargs)``: a Trainer (``max_epochs`` 10, gradient
    clipping 5, the checkpoint with the best ``val_acc`` kept), ``ReversePredictor(max_iters =
    max_epochs × batches, **kwargs)`` trained, or loaded from ``checkpoint_path/ReverseTask.ckpt``
    when that file exists, then tested on the validation and test loaders.

    The loaders and ``checkpoint_path`` default to the notebook's globals ``train_loader``,
    ``val_loader``, ``test_loader`` and ``CHECKPOINT_PATH``, as in the tutorial; the model is
    moved to the notebook's ``device`` when there is one. ``trainer_args`` are extra Trainer
    arguments (e.g. ``{"limit_train_batches": 10}``).

    Returns:
        The pair ``(model, result)``, result = ``{"test_acc": ..., "val_acc": ...}``.
    """
    function = "train_reverse"
    _need_lightning(function)
    train_loader = from_notebook("train_loader", train_loader, function)
    val_loader = from_notebook("val_loader", val_loader, function)
    test_loader = from_notebook("test_loader", test_loader, function)
    return _train(ReversePredictor, "ReverseTask.ckpt", "ReverseTask", train_loader, val_loader,
                  [("val_acc", val_loader), ("test_acc", test_loader)], checkpoint_path,
                  max_epochs, 5, trainer_args, False, kwargs, function)


def train_anomaly(train_anom_loader=None, val_anom_loader=None, test_anom_loader=None,
                  checkpoint_path=None, max_epochs: int = 100, trainer_args: dict | None = None,
                  **kwargs) -> tuple[nn.Module, dict]:
    """The tutorial's ``train_anomaly(**kwargs)``: as ``train_reverse`` with
    ``AnomalyPredictor``, ``max_epochs`` 100, gradient clipping 2, the best checkpoint reloaded
    after training (or ``checkpoint_path/SetAnomalyTask.ckpt`` loaded when it exists), then
    tested on the training, validation and test loaders.

    The loaders default to the notebook's ``train_anom_loader``, ``val_anom_loader`` and
    ``test_anom_loader``, ``checkpoint_path`` to its ``CHECKPOINT_PATH``.

    Returns:
        The pair ``(model, result)``, result = ``{"test_acc", "val_acc", "train_acc"}``.
    """
    function = "train_anomaly"
    _need_lightning(function)
    train_loader = from_notebook("train_anom_loader", train_anom_loader, function)
    val_loader = from_notebook("val_anom_loader", val_anom_loader, function)
    test_loader = from_notebook("test_anom_loader", test_anom_loader, function)
    return _train(AnomalyPredictor, "SetAnomalyTask.ckpt", "SetAnomalyTask", train_loader,
                  val_loader, [("test_acc", test_loader), ("val_acc", val_loader),
                               ("train_acc", train_loader)], checkpoint_path, max_epochs, 2,
                  trainer_args, True, kwargs, function)
