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
# # Looking inside a transformers model
#
# A GPT-2-style model from Hugging Face `transformers`, built from a config with random weights and
# run through attnlab's attention (`attn_implementation="attnlab"`), learns to reverse digits in
# a minute or two on a 2-core CPU. Then we look inside: its attention maps (from the fused kernel, not the
# slow "eager" path), attention rollout and gradient-weighted relevance, the interactive viewer,
# and the same views as static figures for a paper.
#
# The task is sequence reversal as next-token prediction: the model reads 8 digits and a
# separator `|`, then writes the digits backwards. To write answer digit i it has to look at input
# digit 7 − i, and its maps should show exactly that.
#
# `ATTNLAB_NOTEBOOK_SMALL=1` trains for a few steps only (the tests run it that way).

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-interpret" + ("-small" if SMALL else "")))
SEED = 0
DIGITS = 8                            # length of the sequences to reverse
STEPS = 60 if SMALL else 350          # training steps of 128 sequences
OUT.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## A GPT-2 that attends through attnlab
#
# Importing `attnlab.integrations.transformers` registers the `"attnlab"` attention implementation;
# every attention layer of the model then runs through attnlab's operator, forward and backward.
# Attention dropout is off: the fused operator has none (a model that asks for it in training mode
# gets an error, not a silent difference).

# %%
# %matplotlib inline
import time

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, GPT2Config

import attnlab.integrations.transformers        # registers attn_implementation="attnlab"
from attnlab import viz
from attnlab.interpret import explain
from attnlab.plot import attention_grid

torch.manual_seed(SEED)
SEP = 10                                         # token 10 separates the digits from the answer
config = GPT2Config(vocab_size=11, n_positions=2 * DIGITS + 1, n_embd=64, n_layer=2, n_head=2,
                    attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
                    bos_token_id=SEP, eos_token_id=SEP)
model = AutoModelForCausalLM.from_config(config, attn_implementation="attnlab")
print(f"{sum(p.numel() for p in model.parameters()):,} parameters; "
      f"attention: {model.config._attn_implementation}")


# %% [markdown]
# ## Training
#
# Fresh batches of 128 sequences; the loss counts the answer only (position `DIGITS + i`
# predicts answer digit i).

# %%
def batch(n, generator=None):
    digits = torch.randint(0, 10, (n, DIGITS), generator=generator)
    return torch.cat([digits, torch.full((n, 1), SEP), digits.flip(1)], dim=1)


optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=STEPS)
started = time.perf_counter()
model.train()
for step in (bar := tqdm(range(STEPS), desc="training")):
    ids = batch(128)
    logits = model(input_ids=ids).logits
    loss = torch.nn.functional.cross_entropy(logits[:, DIGITS:-1].reshape(-1, 11),
                                             ids[:, DIGITS + 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    bar.set_postfix(loss=f"{loss.item():.4f}")
print(f"{time.perf_counter() - started:.0f} s of training")

model.eval()
test = batch(2000, torch.Generator().manual_seed(1))
with torch.no_grad():
    predicted = model(input_ids=test).logits[:, DIGITS:-1].argmax(-1)
accuracy = (predicted == test[:, DIGITS + 1:]).float().mean().item()
print(f"digit accuracy on 2,000 fresh sequences: {100 * accuracy:.2f} %")

# %% [markdown]
# ## The maps, from the fused kernel
#
# `output_attentions=True` returns one `[batch, heads, query, key]` map per layer, computed by
# attnlab's kernel in the same pass as the output. They equal what transformers' own "eager"
# attention computes with the same weights (checked below).

# %%
example = test[:1]
tokens = [str(t) if t < 10 else "|" for t in example[0].tolist()]
with torch.no_grad():
    out = model(input_ids=example, output_attentions=True)
print(len(out.attentions), "layers of", tuple(out.attentions[0].shape))

eager = AutoModelForCausalLM.from_config(GPT2Config(**config.to_dict()), attn_implementation="eager")
eager.load_state_dict(model.state_dict())
with torch.no_grad():
    reference = eager.eval()(input_ids=example, output_attentions=True)
print("largest difference to eager:",
      max((a - b).abs().max().item() for a, b in zip(out.attentions, reference.attentions)))
attention_grid(out.attentions, tokens, title="GPT-2 through attnlab: every layer and head")

# %% [markdown]
# ## Rollout and gradient relevance
#
# A map shows one layer. *Attention rollout* (Abnar & Zuidema, 2020) multiplies the layers' maps
# (with the residual connection) to say what each position draws on through the whole network.
# *Gradient relevance* (Chefer et al., 2021) weighs each map by the gradient of one prediction with
# respect to it; the gradient comes from attnlab's fused backward, which can hand back
# ∂loss/∂weights without building an autograd graph over them. Below: what the prediction of
# answer digit 2 draws on. It should be input digit 5 (counting from 0). Both methods start from the
# identity (the residual connection: every position draws on itself), so the position's own entry
# is left out of the bars.

# %%
position = DIGITS + 2                     # predicts answer digit 2 = input digit DIGITS - 3
answer = int(example[0, position + 1])
gradient = explain(lambda: model(input_ids=example), target=lambda o: o.logits[0, position, answer])
rolled = explain(lambda: model(input_ids=example), method="rollout")

figure, axes = plt.subplots(1, 2, figsize=(11, 2.8))
for ax, (name, relevance) in zip(axes, [("attention rollout", rolled.relevance),
                                        ("gradient relevance", gradient.relevance)]):
    row = relevance[0, position].detach().clone()
    row[position] = 0                             # its own entry: the residual connection
    ax.bar(range(len(tokens)), row)
    ax.set_xticks(range(len(tokens)), tokens)
    ax.set_title(f"{name}: what position {position} draws on")
figure.tight_layout()

# %% [markdown]
# ## The viewer
#
# One self-contained HTML page (no network, no CDN): hover over a token to see its links, pick a
# layer and head, or switch to the model view. It shows inline here and is saved as a file.

# %%
viewer = viz.head_view(out.attentions, tokens, title="GPT-2 reversing digits")
viewer.save(OUT / "interpret.html")
viewer

# %% [markdown]
# ## For a paper
#
# The same views as matplotlib figures: PNG, SVG or PDF.

# %%
viz.static.model_view_figure(out.attentions, tokens).savefig(OUT / "model_view.pdf")
head_figure = viz.static.head_view_figure(out.attentions, tokens, layer=1, head="all")
head_figure.savefig(OUT / "head_view.svg")
print(sorted(p.name for p in OUT.iterdir()))
head_figure
