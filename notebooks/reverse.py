# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Sequence reversal: watching one attention head learn to look backwards
#
# The input is 16 digits, the target is the same digits in reverse order. Position *i* of the
# output has to copy position *15 − i* of the input, so each output position needs information
# from exactly one, distant, input position. A single self-attention head can do that if it
# learns to point query *i* at key *15 − i*, and the positional encoding is what lets it
# tell positions apart.
#
# This notebook follows the UvA Deep Learning tutorial "Transformers and Multi-Head Attention"
# (Phillip Lippe). It trains the tutorial's one-layer, one-head transformer with `attnlab`, checks
# its accuracy against the tutorial's (100 % on validation and test) and draws the attention map,
# which should come out as an anti-diagonal. The second half runs **the tutorial's own code**
# (its `ReverseDataset`, `ReversePredictor`, `train_reverse` and `plot_attention_maps`, from
# `attnlab.tutorials.uvadl`) unchanged on attnlab.
#
# Set the environment variable `ATTNLAB_NOTEBOOK_SMALL=1` for a small run (seconds instead of
# a minute); the tests run the notebook that way.

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-reverse" + ("-small" if SMALL else "")))
SEED = 0

# %%
# %matplotlib inline
import torch
import attnlab
from attnlab import plot
from attnlab.tasks import reverse
from attnlab.train import fit

torch.set_num_threads(1)  # a model this small trains faster on one thread than on two busy ones
config = reverse.fast_config(SEED) if SMALL else reverse.default_config(SEED)
config

# %% [markdown]
# ## The data
#
# Digits are one-hot encoded; the label of every position is a class out of 10. Training sets are
# drawn once per seed; the last partial batch is dropped, as in the tutorial.

# %%
task = reverse.make_task(config)
inputs, targets = next(iter(task.train_batches(0, torch.Generator().manual_seed(SEED))))
print("input shape", tuple(inputs.shape), "(batch, positions, one-hot)")
print("sequence:", inputs[0].argmax(-1).tolist())
print("target:  ", targets[0].tolist())

# %% [markdown]
# ## The model
#
# Input projection to 32 features, the sinusoidal positional encoding, one encoder block with a
# single head (attention through `attnlab.scaled_dot_product_attention`), and a small output
# network that predicts the digit at every position.

# %%
print(task.model)
print(sum(p.numel() for p in task.model.parameters()), "parameters")

# %% [markdown]
# ## Training
#
# Adam with the cosine warm-up schedule, gradient clipping at 5, cross-entropy over every
# position. As the tutorial's trainer does, the figures at the end are those of the epoch with
# the best validation accuracy (the first one, on a tie), whose weights are reloaded. The run
# keeps a checkpoint in `OUT`: running the cell again resumes from it, or just loads it when
# training is complete.

# %%
result = fit(task, config.train, out_dir=OUT, progress=False)
for row in result["history"]:
    print(f"epoch {row['epoch']:2d}  train loss {row['train_loss']:.4f}  val accuracy {100 * row['accuracy']:.2f} %")
print(f"weights of epoch {result['selected_epoch']} ({result['selected_by']}): "
      f"test accuracy {100 * result['test']['accuracy']:.2f} %  (the tutorial: 100.00 %)")
plot.training_curves(result["history"])

# %% [markdown]
# ## What the head attends to
#
# Rows are queries (output positions), columns are keys (input positions), both labelled with the
# input digits; `origin="lower"` puts query 0 at the bottom. A trained model concentrates each
# row on the column of the mirrored position, with some weight on its neighbours.

# %%
maps, tokens = reverse.attention_example(task)
plot.attention_grid(maps, tokens, title="layer 1, head 1 on a test sequence")

# %%
# How sharp is it? For every query, where does the largest weight go?
argmax = maps[0][0, 0].argmax(-1)
print("query -> key with the most weight:", argmax.tolist())
print("mirror position for every query:", (argmax == torch.arange(15, -1, -1)).all().item())

# %% [markdown]
# ## The tutorial's own code, on attnlab
#
# `attnlab.tutorials.uvadl` gives the tutorial's names, signatures and mask convention (a query
# may not attend where `mask == 0`), computing through attnlab's operator. The cells below are the
# tutorial's, with its definitions replaced by one import: its worked example of
# `scaled_dot_product` (seed 42), its data loaders, `train_reverse` (a Lightning `Trainer` that
# keeps the checkpoint with the best `val_acc`) and `plot_attention_maps`. The small mode trains
# on fewer sequences for 2 epochs.

# %%
import logging
from functools import partial

import lightning as L
import torch.nn.functional as F
import torch.utils.data as data
from attnlab.tutorials.uvadl import (ReverseDataset, plot_attention_maps, scaled_dot_product,
                                     train_reverse)

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # no banner about GPUs

# The tutorial's worked example: seed 42, then q, k, v = randn(3, 2) each.
seq_len, d_k = 3, 2
L.seed_everything(42)
q = torch.randn(seq_len, d_k)
k = torch.randn(seq_len, d_k)
v = torch.randn(seq_len, d_k)
values, attention = scaled_dot_product(q, k, v)
print("Q\n", q)
print("K\n", k)
print("V\n", v)
print("Values\n", values)
print("Attention\n", attention)

# %%
CHECKPOINT_PATH = str(OUT / "tutorial")
device = torch.device("cpu")
L.seed_everything(SEED)
dataset = partial(ReverseDataset, 10, 16)
train_loader = data.DataLoader(dataset(5000 if SMALL else 50000), batch_size=128, shuffle=True,
                               drop_last=True)
val_loader = data.DataLoader(dataset(1000), batch_size=128)
test_loader = data.DataLoader(dataset(10000), batch_size=128)

reverse_model, reverse_result = train_reverse(
    input_dim=train_loader.dataset.num_categories, model_dim=32, num_heads=1,
    num_classes=train_loader.dataset.num_categories, num_layers=1, dropout=0.0, lr=5e-4,
    warmup=50, max_epochs=2 if SMALL else 10,
    trainer_args={"enable_progress_bar": False, "enable_model_summary": False, "logger": False})
print(f"Val accuracy:  {(100.0 * reverse_result['val_acc']):4.2f}%")
print(f"Test accuracy: {(100.0 * reverse_result['test_acc']):4.2f}%")

# %%
data_input, labels = next(iter(val_loader))
inp_data = F.one_hot(data_input, num_classes=reverse_model.hparams.num_classes).float()
inp_data = inp_data.to(device)
attention_maps = reverse_model.get_attention_maps(inp_data)
plot_attention_maps(data_input, attention_maps, idx=0)
