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
# # Attention basics
#
# The tutorials' small demonstrations, each computed with `attnlab`: scaled dot-product
# attention on a 3 × 2 example, attention as a soft key–value lookup, the sinusoidal positional
# encoding, the warm-up schedule, three ways to score a query against keys, and an attention-map
# grid. Everything here takes a second; `ATTNLAB_NOTEBOOK_SMALL=1` changes nothing but the output
# folder.

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-basics" + ("-small" if SMALL else "")))
SEED = 0

# %%
# %matplotlib inline
import torch
import attnlab
from attnlab import nn as ann
from attnlab import plot

torch.manual_seed(SEED)
torch.set_printoptions(precision=4, sci_mode=False)
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## Scaled dot-product attention, 3 positions × 2 features
#
# softmax(q kᵀ / √d_k) v: every row of the weights sums to 1, and every output row is a weighted
# mean of the value rows.

# %%
q, k, v = (torch.randn(3, 2) for _ in range(3))
output, weights = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
print("q\n", q, "\nk\n", k, "\nv\n", v, sep="")
print("weights\n", weights, "\nrow sums ", weights.sum(-1), sep="")
print("output\n", output, sep="")

# %% [markdown]
# ## Attention as a key–value lookup
#
# Keys are 10 × rows of the identity, with the last two equal; the values have distinct rows. A
# query equal to a key scores 100 on that key and 0 on the others, so (with scale 1) the softmax
# puts almost all weight on it and the output is that key's value. A query matching two equal
# keys splits the weight and returns the mean of their values.

# %%
keys = 10 * torch.eye(4)
keys[3] = keys[2]
values = torch.arange(16.0).reshape(4, 4)
queries = torch.stack([keys[0], keys[1], keys[2]])
output, weights = attnlab.scaled_dot_product_attention(queries, keys, values, scale=1.0, need_weights=True)
print("values\n", values, "\nweights\n", weights, "\noutput\n", output, sep="")
print("query 0 returns value 0:", torch.allclose(output[0], values[0]))
print("query 2 returns the mean of values 2 and 3:", torch.allclose(output[2], values[2:].mean(0)))

# %% [markdown]
# ## Sinusoidal positional encoding
#
# PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)), here d = 48 over
# 96 positions. Low dimensions oscillate fast, high ones slowly, so every position gets its own
# pattern, and the encoding of pos + k is a rotation of that of pos.

# %%
table = ann.sinusoidal_table(96, 48)
pe_figure = plot.positional_encoding(table, dims=(1, 2, 3, 4))
pe_figure

# %% [markdown]
# ## The cosine warm-up schedule
#
# The learning rate rises linearly for the first 100 iterations (Adam's statistics are still
# poor then), then follows half a cosine down to 0 at iteration 2000.

# %%
optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
scheduler = ann.CosineWarmupScheduler(optimizer, warmup=100, max_iters=2000)
factors = []
for _ in range(2000):
    factors.append(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
print(f"largest factor {max(factors):.3f} at iteration {factors.index(max(factors))}")
plot.lr_factors(factors, warmup=100)

# %% [markdown]
# ## Multiplicative, scaled and additive scores on one example
#
# One query against eight keys of width 32. Luong's multiplicative score qᵀk grows with the
# width, so its softmax is nearly one-hot; dividing by √d (scaled dot product) keeps the weights
# spread out; Bahdanau's additive score w₃ᵀ tanh(W₁q + W₂k) is bounded by the tanh and by w₃,
# whatever the width (its weights here are random, untrained).

# %%
features = torch.randn(1, 8, 32)
query = torch.randn(1, 1, 32)
layers = {"multiplicative qᵀk": ann.MultiplicativeAttention(),
          "scaled qᵀk/√d": ann.ScaledDotProductAttention(),
          "additive (Bahdanau)": ann.AdditiveAttention(32, 32, hidden_dim=16)}
weights = {}
for name, layer in layers.items():
    layer.attend(features, query)
    weights[name] = layer.last_weights[0, 0]
    print(f"{name:22s} scores {layer.get_scores(features, query)[0, 0].detach().numpy().round(2)}")
plot.weight_bars(weights, keys=[f"k{i}" for i in range(8)], title="weights of one query over eight keys")

# %% [markdown]
# ## Attention-map grid
#
# Rows are layers, columns are heads, each map has the queries on the y axis (`origin="lower"`)
# and the keys on the x axis, both labelled with the input tokens. Here an untrained two-layer,
# two-head encoder on a short sequence.

# %%
tokens = list("attention")
encoder = ann.TransformerEncoder(num_layers=2, input_dim=16, num_heads=2, dim_feedforward=32)
embedding = torch.nn.Embedding(len(set(tokens)), 16)
ids = torch.tensor([[sorted(set(tokens)).index(t) for t in tokens]])
maps = encoder.get_attention_maps(embedding(ids) + ann.sinusoidal_table(len(tokens), 16))
plot.attention_grid(maps, tokens, title="untrained encoder, 2 layers × 2 heads")

# %%
pe_figure.savefig(OUT / "positional_encoding.png", dpi=120)
sorted(p.name for p in OUT.iterdir())
