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
# # Attention at 16,384 tokens: summaries instead of maps
#
# A Llama-style model (hidden size 256, 4 heads, 4 layers, random weights from a config) reads
# 16,384 tokens on the CPU. Its attention maps would be 4 × 16,384² weights per layer: 4 GiB in
# float32, 16 GiB for the four layers. `output_attentions=True` cannot hold that here; attnlab's
# fused kernel instead reduces every layer's weights as it makes them, to what one looks at on a
# long input:
#
# - how much attention each token **receives** (attention sinks show up here);
# - the **entropy** of each query's weights (broad or focused heads);
# - each query's **top-k** keys;
# - a **pooled** map: the mean weight in each block of 256 × 256 tokens.
#
# At the end, `attnlab.viz.summary_view` puts all of it in one interactive page, with the exact
# weights of a few blocks of the pooled map.
#
# `ATTNLAB_NOTEBOOK_SMALL=1` runs 1,024 tokens instead and checks the summaries against
# transformers' own eager attention (the tests run it that way).

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT",
                          "runs/notebook-long-inputs" + ("-small" if SMALL else "")))
LENGTH = 1024 if SMALL else 16384    # tokens
POOL = LENGTH // 64                  # a 64 × 64 pooled map per head
TOPK = 8
SEED = 0
OUT.mkdir(parents=True, exist_ok=True)

# %%
# %matplotlib inline
import resource
import time

import matplotlib.pyplot as plt
import torch
from transformers import AutoModel, LlamaConfig

import attnlab.integrations.transformers        # registers attn_implementation="attnlab"
from attnlab.interpret import summarize

torch.manual_seed(SEED)
config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=LENGTH)
model = AutoModel.from_config(config, attn_implementation="attnlab").eval()
ids = torch.randint(0, 1000, (1, LENGTH), generator=torch.Generator().manual_seed(SEED))
print(f"{sum(p.numel() for p in model.parameters()):,} parameters, {LENGTH:,} tokens")

# %% [markdown]
# ## What the maps would take
#
# Eager attention with `output_attentions=True` keeps every layer's weights, and builds each
# layer's scores and softmax besides: at least (layers + 2) × heads × L² floats.

# %%
def gib(n_bytes):
    return n_bytes / 2**30


layers, heads = config.num_hidden_layers, config.num_attention_heads
needed = (layers + 2) * heads * LENGTH**2 * 4
with open("/proc/meminfo") as f:
    available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
print(f"eager output_attentions needs at least {gib(needed):.1f} GiB; "
      f"this machine has {gib(available):.1f} GiB available: "
      f"{'it fits' if needed < available else 'it does not fit'}")

# %% [markdown]
# ## Every layer's summaries, in one forward pass
#
# `summarize` collects the summaries of every attention call made inside it; the model runs as
# usual (no `output_attentions`), and no call holds its L × L weights. `keep_inputs=True` also
# keeps each layer's query and key (references to the model's own tensors, 2 × 16 MiB per layer
# here), from which the exact weights of any block can be recomputed later.

# %%
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
with torch.no_grad(), summarize(received=True, entropy=True, topk=TOPK, pool=POOL,
                                keep_inputs=True) as s:
    out = model(input_ids=ids)
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
print(f"forward with every layer's summaries: {seconds:.1f} s; peak memory of this process "
      f"{peak / 2**20:.2f} GiB (it was {peak_before / 2**20:.2f} GiB before)")
received, entropy = s.stack("received"), s.stack("entropy")   # [layers, 1, heads, L]
pooled = s.stack("pooled")                                     # [layers, 1, heads, 64, 64]
print(len(s), "layers:", tuple(received.shape), tuple(entropy.shape), tuple(pooled.shape))

# %% [markdown]
# In small mode the same model with transformers' eager attention gives the full maps, and the
# summaries equal their reductions.

# %%
if SMALL:
    eager = AutoModel.from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(model.state_dict())
    with torch.no_grad():
        maps = eager(input_ids=ids, output_attentions=True).attentions
    for layer, weights in enumerate(maps):
        difference = max((s[layer].received - weights.sum(-2)).abs().max().item(),
                         (s[layer].entropy - torch.special.entr(weights).sum(-1)).abs().max().item(),
                         (s[layer].topk_weights - weights.topk(TOPK, -1).values).abs().max().item())
        print(f"layer {layer}: largest difference to eager's reductions {difference:.1e}")

# %% [markdown]
# ## Attention received along the sequence
#
# Causal attention gives early tokens more chances to be attended to; a token that receives far
# more than its neighbours is an attention sink.

# %%
positions = torch.arange(LENGTH)


def per_layer(values, xlabel, ylabel, bound=None, log=False):
    """One panel per layer, one line per head, along the sequence; bound: a dashed line."""
    fig, axes = plt.subplots(1, layers, figsize=(4 * layers, 3), sharey=True)
    for layer, ax in enumerate(axes):
        for head in range(heads):
            ax.plot(values[layer, 0, head], lw=0.7, label=f"head {head}")
        if bound is not None:
            ax.plot(bound[0], "k--", lw=0.8, label=bound[1])
        if log:
            ax.set_yscale("log")
        ax.set_title(f"layer {layer}")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=7)
    plt.tight_layout()
    plt.show()


per_layer(received, "key position", "attention received (Σ over queries)", log=True)

# %% [markdown]
# ## Entropy of each head
#
# The entropy of query i's weights is at most log(i + 1) under the causal mask (uniform weights
# over the keys it sees); the dashed line marks that bound.

# %%
per_layer(entropy, "query position", "entropy (nats)", bound=(torch.log(positions + 1.0), "log(i + 1)"))

# %% [markdown]
# ## Pooled maps and the top keys
#
# Each pooled cell is the mean weight of a block of POOL × POOL query–key pairs. On the right:
# how far back each query's strongest key lies.

# %%
fig, axes = plt.subplots(1, layers + 1, figsize=(4 * (layers + 1), 3.6))
for layer in range(layers):
    axes[layer].imshow(pooled[layer, 0].mean(0).clamp_min(1e-12).log10(), cmap="viridis")
    axes[layer].set_title(f"layer {layer}: log10 mean weight")
    axes[layer].set_xlabel(f"key block ({POOL} tokens)")
axes[0].set_ylabel(f"query block ({POOL} tokens)")
distance = positions[None, :] - torch.stack([s[layer].topk_indices[0, :, :, 0]
                                             for layer in range(layers)]).flatten(0, 1)
axes[-1].hist(distance.flatten().numpy(), bins=60, log=True)
axes[-1].set_title("query − its top key")
axes[-1].set_xlabel("tokens back")
plt.tight_layout()
plt.show()


# %% [markdown]
# ## All of it in one page
#
# `attnlab.viz.summary_view` draws the summaries as one self-contained HTML page (it loads nothing
# from the network): the pooled map per layer and head, the attention received and the entropy
# along the sequence (drag to zoom into positions, hover to read a position's values), each head's
# mean entropy, and the top-k keys of a query as arcs (pick it with the slider or a click).
# Clicking a block of the pooled map shows its exact POOL × POOL weights when the page carries
# them: they are recomputed for those blocks only, from the inputs `keep_inputs=True` kept
# (`s.block_weights(layer, batch, head, q_block, k_block)`). Here: each head's two most attended
# blocks off the diagonal (`"auto"`), and in layer 0, head 0 the last queries against the first
# keys and against their own block's neighbour.

# %%
from attnlab import viz

last = LENGTH // POOL - 1
tokens = [f"#{token}" for token in ids[0].tolist()]     # the (random) token ids as labels
view = viz.summary_view(s, tokens, zoom=["auto", (0, 0, last, 0), (0, 0, last, last - 1)],
                        title=f"A random Llama-style model over {LENGTH:,} tokens")
path = view.save(OUT / "long_inputs.html")
print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
if SMALL:  # a recomputed block is the same block of eager's weights
    block = s.block_weights(0, 0, 0, last, 0)
    print("block (last, 0) against eager's weights:",
          f"{(block - maps[0][0, 0, last * POOL:, :POOL]).abs().max().item():.1e}")
view
