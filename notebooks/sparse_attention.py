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
# # Sparse attention you can see: softmax, entmax-1.5, sparsemax and hard attention
#
# Attention turns each query's scores z₁…z_K into weights that sum to 1. How it does that decides
# what the map can look like:
#
# - **softmax**: p_j = exp(z_j) / Σ exp(z_k). Every key gets a weight > 0, however small, so a map
#   is never exactly one-hot; "the model looks at key 3" always means "mostly at key 3".
# - **sparsemax** (Martins & Astudillo, 2016): the Euclidean projection of z onto the probability
#   simplex, p_j = [z_j − τ]₊ with the threshold τ that makes the weights sum to 1. Keys whose
#   score is more than a margin below the best get *exactly* 0.
# - **1.5-entmax** (Peters, Niculae & Martins, 2019): p_j = [z_j/2 − τ]₊², between the two: smooth
#   near the top like softmax, exact zeros in the tail like sparsemax. Both are differentiable
#   almost everywhere, so they train with plain backpropagation.
# - **hard attention**: a one-hot vector on the arg-max key. It is what "the model looks there"
#   means literally, but its gradient with respect to the scores is zero almost everywhere, so it
#   is not trained this way; below it is applied to a softmax-trained model after training, as
#   the NYU notebook's contrast between soft and hard attention does.
#
# attnlab's operator takes the normalizer as an argument (`normalizer="softmax" | "sparsemax" |
# "entmax15" | "entmax"`), and so do its modules and the experiments (`--normalizer`). This
# notebook trains the tutorials' models with each and puts their maps side by side; cells that are
# exactly 0 are drawn **white**.
#
# `ATTNLAB_NOTEBOOK_SMALL=1` selects a small run (a few seconds of training per model); the tests
# run it that way.

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-sparse-attention" + ("-small" if SMALL else "")))
SEED = 0

# %%
# %matplotlib inline
import dataclasses

import torch
import attnlab
from attnlab import plot
from attnlab.tasks import permutation, reverse
from attnlab.train import fit

torch.set_num_threads(1)  # these small models train faster on one thread than on two busy ones
NORMALIZERS = ["softmax", "entmax15", "sparsemax"]

# %% [markdown]
# ## One row of scores, four normalizers
#
# The same scores for eight keys, through the operator: a query q = [1] and keys k_j = [z_j] give
# the scores z_j with `scale=1`. Softmax spreads weight over every key; entmax-1.5 and sparsemax
# keep the top few and give the rest exactly 0; hard attention keeps one.

# %%
scores = torch.tensor([2.0, 1.6, 1.1, 0.4, 0.0, -0.5, -1.0, -2.0])
query, keys, values = torch.ones(1, 1), scores[:, None], torch.eye(len(scores))
rows = {}
for normalizer in NORMALIZERS:
    _, weights = attnlab.scaled_dot_product_attention(query, keys, values, scale=1.0,
                                                      need_weights=True, normalizer=normalizer)
    rows[normalizer] = weights[0]
rows["hard (arg-max)"] = torch.nn.functional.one_hot(scores.argmax(), len(scores)).float()
for name, row in rows.items():
    print(f"{name:>15}: {' '.join(f'{w:.3f}' for w in row.tolist())}   "
          f"exact zeros {int((row == 0).sum())} of {len(row)}")
plot.weight_bars(rows, keys=[f"{z:+.1f}" for z in scores.tolist()],
                 title="weights of one query over eight keys (key labels: their scores)")


# %% [markdown]
# ## Sequence reversal: most of the map becomes exactly zero
#
# The UvA tutorial's task (16 digits, output position i copies input position 15 − i) with its
# one-layer, one-head transformer, trained once per normalizer with the same seed and data (the
# `--fast` recipe; `python -m attnlab reverse --fast --normalizer sparsemax` on the command line).
# `attention_zero_fraction` is the fraction of the test maps' weights (every layer, head, query
# and key) that are exactly 0.

# %%
def reverse_config(normalizer):
    config = dataclasses.replace(reverse.fast_config(SEED), normalizer=normalizer)
    if SMALL:
        config = dataclasses.replace(config, train_size=4_000, test_size=500, train=dataclasses.replace(config.train, epochs=2))
    return config


reversal = {}
for normalizer in NORMALIZERS:
    config = reverse_config(normalizer)
    task = reverse.make_task(config)
    result = fit(task, config.train, out_dir=OUT / f"reverse-{normalizer}", progress=False)
    reversal[normalizer] = (task, result)
    print(f"{normalizer:>9}: test accuracy {100 * result['test']['accuracy']:6.2f} %, exact zeros "
          f"in the maps {100 * result['test']['attention_zero_fraction']:5.1f} %, "
          f"{result['seconds']:.0f} s of training")

# %% [markdown]
# The maps of one test sequence. "hard" is the softmax model's map with each row replaced by a
# one-hot vector on its arg-max. The red frames mark the mirrored positions (i, 15 − i).

# %%
maps = {}
for normalizer, (task, _) in reversal.items():
    layer_maps, tokens = reverse.attention_example(task)
    maps[normalizer] = layer_maps[0][0, 0]
soft = maps["softmax"]
maps["hard (softmax's arg-max)"] = torch.nn.functional.one_hot(soft.argmax(-1), soft.shape[-1]).float()
length = len(tokens)
plot.attention_side_by_side(maps, tokens, tokens, marked=[(i, length - 1 - i) for i in range(length)],
                            title="sequence reversal: one test sequence")

# %%
digits = torch.randint(10, (500, 16), generator=torch.Generator().manual_seed(SEED + 5))
inputs = reverse.one_hot(digits, 10)
mirror = torch.arange(15, -1, -1)
for normalizer, (task, _) in reversal.items():
    weights = task.model.get_attention_maps(inputs)[0][:, 0]          # [B, L, L]
    on_mirror = weights[:, torch.arange(16), mirror]
    print(f"{normalizer:>9}: keys kept per row {(weights > 0).sum(-1).float().mean():5.2f} of 16, "
          f"weight on the mirrored key {on_mirror.mean():.3f}, rows exactly one-hot on it "
          f"{100 * (on_mirror == 1).float().mean():5.1f} %")

# %% [markdown]
# Sparsemax and 1.5-entmax zero most of each row: a row keeps the mirrored position and a couple of
# its neighbours, and the tail that softmax spreads over every other key is gone. The rows are not
# one-hot, though: sparsemax gives a row a single key only when its score leads the runner-up by at
# least 1 (1.5-entmax: by at least 2), and once the model answers right the loss has little reason
# to push the scores that far apart.
#
# **Hard attention on the trained softmax model.** A boolean mask with a single allowed key per row
# makes the operator's softmax exactly one-hot, so passing the arg-max map as the mask runs the
# softmax model with hard attention:

# %%
task, result = reversal["softmax"]
with torch.no_grad():
    task.model.eval()
    soft_map = task.model.get_attention_maps(inputs)[0]               # [B, 1, L, L]
    hard_mask = torch.nn.functional.one_hot(soft_map.argmax(-1), 16).bool()
    soft_acc = (task.model(inputs).argmax(-1) == digits.flip(1)).float().mean()
    hard_acc = (task.model(inputs, mask=hard_mask).argmax(-1) == digits.flip(1)).float().mean()
print(f"softmax model, its own soft attention: {100 * soft_acc:.2f} %; "
      f"with hard (arg-max) attention: {100 * hard_acc:.2f} %")


# %% [markdown]
# ## Permutation composition: rows that pick exactly p₂[i]
#
# The permutation-composition lab's task: inputs p₁ then p₂, and output position n + i must say
# p₁[p₂[i]], read at input position p₂[i]. The LSTM + attention model with positions added and the
# autoregressive mask, trained once per normalizer with two kinds of scores: **scaled**
# dot-product qᵀk/√32 (the experiment's main row) and **multiplicative** qᵀk (Luong's, unscaled:
# the same model with scores √32 ≈ 5.7 times larger). Here the zero fraction counts the answer
# rows n + i only (the rows the loss uses), over the keys the autoregressive mask leaves open:
# masked keys are 0 under every normalizer.

# %%
def permutation_config(kind, normalizer):
    base = permutation.fast_config(SEED) if SMALL else permutation.default_config(SEED)
    if SMALL:
        base = dataclasses.replace(base, batches_per_epoch=150, test_size=1000)
    return dataclasses.replace(base, attention=kind, autoregressive=True, normalizer=normalizer)


composition = {}
for kind in ("scaled", "multiplicative"):
    for normalizer in NORMALIZERS:
        config = permutation_config(kind, normalizer)
        task = permutation.make_task(config)
        result = fit(task, config.train, out_dir=OUT / config.variant, progress=False)
        composition[kind, normalizer] = (task, result)
        print(f"{kind:>14} {normalizer:>9}: test accuracy {100 * result['test']['accuracy']:6.2f} %, "
              f"arg-max on p2 {100 * result['test']['argmax_on_p2']:6.2f} %, exact zeros "
              f"{100 * result['test']['attention_zero_fraction']:5.1f} %, {result['seconds']:.0f} s")

# %%
example = composition["scaled", "softmax"][0].examples["attention"][0]
n = len(example) // 2
tokens = [str(d) for d in example.tolist()]
frames = [(n + i, int(example[n + i])) for i in range(n)]
for kind in ("scaled", "multiplicative"):
    maps = {normalizer: composition[kind, normalizer][0].model.attention_map(example[None])[0]
            for normalizer in NORMALIZERS}
    soft = maps["softmax"]
    maps["hard (softmax's arg-max)"] = torch.nn.functional.one_hot(soft.argmax(-1), soft.shape[-1]).float()
    display(plot.attention_side_by_side(
        maps, tokens, tokens, marked=frames,
        title=f"{kind} attention: framed (n + i, p₂[i]); white = exactly 0 (above the diagonal: masked)"))

# %%
inputs, _ = permutation.permutation_batch(2000, n, torch.Generator().manual_seed(SEED + 3))
for (kind, normalizer), (task, _) in composition.items():
    answers = task.model.attention_map(inputs)[:, n:]                 # rows n + i
    on_p2 = answers.gather(-1, inputs[:, n:, None]).squeeze(-1)       # the weight on p2[i]
    print(f"{kind:>14} {normalizer:>9}: keys kept per answer row {(answers > 0).sum(-1).float().mean():5.2f}, "
          f"weight on p2[i] {on_p2.mean():.3f}, rows exactly one-hot on p2[i] "
          f"{100 * (on_p2 == 1).float().mean():5.1f} %")

# %% [markdown]
# ## What the maps show
#
# - Softmax maps are dense: even a model that answers every test sequence right leaves weight on
#   every open key; its exact-zero fraction is 0 and no row is one-hot.
# - Sparsemax and 1.5-entmax reach the same accuracy with maps in which many weights are exact
#   zeros; how many depends on the normalizer (sparsemax is the sparser) and on how far apart the
#   scores are (the counts above).
# - Whether a row becomes *exactly* one-hot depends on how far apart the scores get. With the
#   scaled scores (queries from a tanh-bounded LSTM, divided by √32) the gap stays below
#   sparsemax's threshold of 1 and the rows keep several keys, p₂[i] the heaviest; the unscaled
#   multiplicative scores cross it, and sparsemax then puts all of a row's weight on p₂[i] in most
#   rows: hard attention, trained by gradient descent.
# - Hard attention applied to the softmax model keeps its answers here because its soft maps
#   already peak at the right key; the sparse normalizers make that visible in the weights
#   themselves instead of after an arg-max.
#
# The same comparison over five seeds, with the set-anomaly task too, is on the documentation's
# page *Sparse attention* (`docs/experiments/sparse-attention.md`).
