"""Writes notebooks from the cells below: `python notebooks/make_notebooks.py NAME... [--execute]`.

With --execute the notebook is run in full mode (ATTNLAB_NOTEBOOK_SMALL unset) and saved with its
outputs, which is how the committed notebooks are made; the tests re-run them in small mode."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent


def parameters_cell(name: str, extra: str = "") -> str:
    return f'''# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-{name}" + ("-small" if SMALL else "")))
SEED = 0{extra}'''


SPARSE_AND = [
    new_markdown_cell("""# Sparse AND: 65 parameters that find the bits that matter

The label of a string of T = 17 bits is the AND of *s* of them, the targets; the other bits are
noise. A network that knows nothing about the task has to find out which bits count. A single
self-attention head can do that by *looking* at the targets: its query learns to match the keys
of the target positions, and the weighted mean it returns is large only when they are all 1.

This notebook follows the Neuromatch NeuroAI attention tutorial (W1D5, Tutorial 3) with `attnlab`: the two data generators, a one-head
self-attention model (SAT, 65 parameters, attention through `attnlab.scaled_dot_product_attention`)
against an MLP baseline (9,729 parameters), the results table over several seeds, a rule task in
which the last token decides which of two target sets counts, and the gain demo that shows why
larger scores make attention sparser.

`ATTNLAB_NOTEBOOK_SMALL=1` selects a small run (fewer epochs and seeds); the tests run it that
way."""),
    new_code_cell(parameters_cell("sparse-and", "\nSEEDS = 2 if SMALL else 5  # runs per row of the table")),
    new_code_cell("""%matplotlib inline
import torch
import attnlab
from attnlab import plot
from attnlab.tasks import sparse_and as sa
from matplotlib.figure import Figure

config = sa.fast_config(SEEDS) if SMALL else sa.default_config(SEEDS)
rule_config = sa.rule_fast_config() if SMALL else sa.rule_default_config()
OUT.mkdir(parents=True, exist_ok=True)
config"""),
    new_markdown_cell("""## The data

Every bit is 1 with probability 0.5^(1/3), so the AND of s = 2 targets is 1 in about 63 % of the
samples and of s = 4 in about 40 %. The generator redraws a sample set (up to 100 times) until
its label mean lies in [0.4, 0.6] and no other column happens to equal a target column, which
would make the targets ambiguous. The targets sit among the first T − 1 positions; the last
token is the one whose attention we will look at."""),
    new_code_cell("""generator = sa.SparseAndGenerator(config.seq_len, 2, seed=SEED)
bits, labels = generator.sample(config.train_size)
print("targets:", generator.targets.tolist(), " label mean:", labels.mean().item())
plot.boolean_samples(bits, labels, generator.targets.tolist(), title="2-sparse AND: samples, targets boxed")"""),
    new_markdown_cell("""## The two models

The SAT embeds each bit in 2 dimensions, adds a learned position, and runs one attention head
whose values are single numbers; a linear readout of the 17 attention outputs gives the logit.
The MLP sees the 17 bits directly. Both are trained full batch with Adam on the binary
cross-entropy (SAT: lr 1e-2, 2000 epochs; MLP: lr 1e-3, 500 epochs)."""),
    new_code_cell("""for name, model in (("SAT", sa.SAT(config.seq_len)), ("MLP", sa.MLP(config.seq_len))):
    print(f"{name}: {sa.parameter_count(model):,} parameters")
    print(model, "\\n")"""),
    new_markdown_cell("""## One SAT on s = 2

Where does the last token look after training? Each line is one validation sample, coloured by
its label; the right panel has the mean ± std per input. The weight gathers on the two boxed
targets."""),
    new_code_cell("""run = sa.run_one("SAT", 2, SEED, config)
print(f"validation accuracy {run['val']['accuracy']:.3f}, loss {run['val']['loss']:.4f}; "
      f"{run['seconds']:.1f} s")
val_bits, val_labels = run["val_data"]
plot.last_token_attention(sa.last_token_attention(run["model"], val_bits), val_labels,
                          run["generator"].targets.tolist(), title="SAT, s = 2")"""),
    new_code_cell("""fig = Figure(figsize=(6, 3), layout="constrained")
ax = fig.subplots()
ax.plot(run["train_losses"])
ax.set(xlabel="epoch (one full-batch step)", ylabel="training loss", yscale="log", title="SAT, s = 2")
fig"""),
    new_markdown_cell("""## The table over seeds

The tutorial's reference is one unseeded run per row; here every row is the mean ± std over `SEEDS`
seeds (the seed draws the targets, the samples and the initial weights; the SAT and the MLP of a
seed see the same data)."""),
    new_code_cell("""table = sa.results_table(config, first_seed=SEED, keep_runs=True)
print(sa.format_table(table["rows"]))
print(f"{sum(row['seconds'] for row in table['rows']):.1f} s of training")
figures = sa.table_figures(table)
for name, figure in figures.items():
    figure.savefig(OUT / f"{name}.png", dpi=120)
figures["results"]"""),
    new_code_cell("""figures["attention_s4"]"""),
    new_markdown_cell("""## The rule task: attention that depends on the context

Now T = 11: ten bits and a last rule bit z. Two disjoint target sets f₁, f₂ of two bits each;
the label is the AND of f₁ when z = 0 and of f₂ when z = 1. The attention graph joins every input
to the output with the product of its readout weight and its attention output, averaged over the
positive samples of one rule: each input's share of the logit."""),
    new_code_cell("""rule_run = sa.run_rule_task(rule_config, seed=SEED)
summary = sa.rule_summary(rule_run, rule_config, SEED)
print(sa.format_rule_summary(summary))
graph = plot.attention_graph(rule_run["edges"], rule_run["generator"].targets,
                             title="readout weight × attention output, positive samples")
graph.savefig(OUT / "attention_graph.png", dpi=120)
graph"""),
    new_markdown_cell("""## Gain: why larger scores make attention sparser

Two query profiles over T = 20 positions, q₁ weighted to the start and q₂ to the end (each sums
to 1), and a noisy sine x. The weights are w = softmax(z₁q₁ + z₂q₂) and the output is y = w·x.
The gains z₁, z₂ scale the scores: at 0 the weights are uniform and y is the plain mean; the
larger a gain, the more w concentrates where its profile is high. Move the sliders (in a live
notebook)."""),
    new_code_cell("""import io

import ipywidgets as widgets
from IPython.display import display

x, q1, q2 = sa.gain_inputs()
z1 = widgets.FloatSlider(value=2.0, min=0, max=10, step=0.5, description="z₁")
z2 = widgets.FloatSlider(value=2.0, min=0, max=10, step=0.5, description="z₂")
view = widgets.Image(format="png")


# The sliders redraw a PNG in an Image widget: no Output widget, whose captured outputs can
# leave a headless run (nbclient, in the tests) waiting.
def redraw(change=None):
    w, y = sa.gain_weights(z1.value, z2.value)
    png = io.BytesIO()
    plot.gain_view(x, q1, q2, w, y, z1.value, z2.value).savefig(png, format="png", dpi=80)
    view.value = png.getvalue()


z1.observe(redraw, "value")
z2.observe(redraw, "value")
redraw()
display(widgets.VBox([widgets.HBox([z1, z2]), view]))"""),
    new_markdown_cell("""The same view for a few fixed gains (a static figure, for readers without a kernel):"""),
    new_code_cell("""settings = [(0, 0), (10, 0), (0, 10), (10, 10), (50, 0)]
fig = Figure(figsize=(3 * len(settings), 2.6), layout="constrained")
for ax, (z1, z2) in zip(fig.subplots(1, len(settings), sharey=True), settings):
    w, y = sa.gain_weights(z1, z2)
    ax.bar(range(len(w)), w.numpy(), color="tab:purple")
    ax.set(title=f"z₁ = {z1}, z₂ = {z2}\\nmax w {w.max():.3f}, y = {y:.2f}", xlabel="position")
fig"""),
]

BASICS = [
    new_markdown_cell("""# Attention basics

The tutorials' small demonstrations, each computed with `attnlab`: scaled dot-product
attention on a 3 × 2 example, attention as a soft key–value lookup, the sinusoidal positional
encoding, the warm-up schedule, three ways to score a query against keys, and an attention-map
grid. Everything here takes a second; `ATTNLAB_NOTEBOOK_SMALL=1` changes nothing but the output
folder."""),
    new_code_cell(parameters_cell("basics")),
    new_code_cell("""%matplotlib inline
import torch
import attnlab
from attnlab import nn as ann
from attnlab import plot

torch.manual_seed(SEED)
torch.set_printoptions(precision=4, sci_mode=False)
OUT.mkdir(parents=True, exist_ok=True)"""),
    new_markdown_cell("""## Scaled dot-product attention, 3 positions × 2 features

softmax(q kᵀ / √d_k) v: every row of the weights sums to 1, and every output row is a weighted
mean of the value rows."""),
    new_code_cell("""q, k, v = (torch.randn(3, 2) for _ in range(3))
output, weights = attnlab.scaled_dot_product_attention(q, k, v, need_weights=True)
print("q\\n", q, "\\nk\\n", k, "\\nv\\n", v, sep="")
print("weights\\n", weights, "\\nrow sums ", weights.sum(-1), sep="")
print("output\\n", output, sep="")"""),
    new_markdown_cell("""## Attention as a key–value lookup

Keys are 10 × rows of the identity, with the last two equal; the values have distinct rows. A
query equal to a key scores 100 on that key and 0 on the others, so (with scale 1) the softmax
puts almost all weight on it and the output is that key's value. A query matching two equal
keys splits the weight and returns the mean of their values."""),
    new_code_cell("""keys = 10 * torch.eye(4)
keys[3] = keys[2]
values = torch.arange(16.0).reshape(4, 4)
queries = torch.stack([keys[0], keys[1], keys[2]])
output, weights = attnlab.scaled_dot_product_attention(queries, keys, values, scale=1.0, need_weights=True)
print("values\\n", values, "\\nweights\\n", weights, "\\noutput\\n", output, sep="")
print("query 0 returns value 0:", torch.allclose(output[0], values[0]))
print("query 2 returns the mean of values 2 and 3:", torch.allclose(output[2], values[2:].mean(0)))"""),
    new_markdown_cell("""## Sinusoidal positional encoding

PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)), here d = 48 over
96 positions. Low dimensions oscillate fast, high ones slowly, so every position gets its own
pattern, and the encoding of pos + k is a rotation of that of pos."""),
    new_code_cell("""table = ann.sinusoidal_table(96, 48)
pe_figure = plot.positional_encoding(table, dims=(1, 2, 3, 4))
pe_figure"""),
    new_markdown_cell("""## The cosine warm-up schedule

The learning rate rises linearly for the first 100 iterations (Adam's statistics are still
poor then), then follows half a cosine down to 0 at iteration 2000."""),
    new_code_cell("""optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
scheduler = ann.CosineWarmupScheduler(optimizer, warmup=100, max_iters=2000)
factors = []
for _ in range(2000):
    factors.append(optimizer.param_groups[0]["lr"])
    optimizer.step()
    scheduler.step()
print(f"largest factor {max(factors):.3f} at iteration {factors.index(max(factors))}")
plot.lr_factors(factors, warmup=100)"""),
    new_markdown_cell("""## Multiplicative, scaled and additive scores on one example

One query against eight keys of width 32. Luong's multiplicative score qᵀk grows with the
width, so its softmax is nearly one-hot; dividing by √d (scaled dot product) keeps the weights
spread out; Bahdanau's additive score w₃ᵀ tanh(W₁q + W₂k) is bounded by the tanh and by w₃,
whatever the width (its weights here are random, untrained)."""),
    new_code_cell("""features = torch.randn(1, 8, 32)
query = torch.randn(1, 1, 32)
layers = {"multiplicative qᵀk": ann.MultiplicativeAttention(),
          "scaled qᵀk/√d": ann.ScaledDotProductAttention(),
          "additive (Bahdanau)": ann.AdditiveAttention(32, 32, hidden_dim=16)}
weights = {}
for name, layer in layers.items():
    layer.attend(features, query)
    weights[name] = layer.last_weights[0, 0]
    print(f"{name:22s} scores {layer.get_scores(features, query)[0, 0].detach().numpy().round(2)}")
plot.weight_bars(weights, keys=[f"k{i}" for i in range(8)], title="weights of one query over eight keys")"""),
    new_markdown_cell("""## Attention-map grid

Rows are layers, columns are heads, each map has the queries on the y axis (`origin="lower"`)
and the keys on the x axis, both labelled with the input tokens. Here an untrained two-layer,
two-head encoder on a short sequence."""),
    new_code_cell("""tokens = list("attention")
encoder = ann.TransformerEncoder(num_layers=2, input_dim=16, num_heads=2, dim_feedforward=32)
embedding = torch.nn.Embedding(len(set(tokens)), 16)
ids = torch.tensor([[sorted(set(tokens)).index(t) for t in tokens]])
maps = encoder.get_attention_maps(embedding(ids) + ann.sinusoidal_table(len(tokens), 16))
plot.attention_grid(maps, tokens, title="untrained encoder, 2 layers × 2 heads")"""),
    new_code_cell("""pe_figure.savefig(OUT / "positional_encoding.png", dpi=120)
sorted(p.name for p in OUT.iterdir())"""),
]

INTERPRET = [
    new_markdown_cell("""# Looking inside a transformers model

A GPT-2-style model from Hugging Face `transformers`, built from a config with random weights and
run through attnlab's attention (`attn_implementation="attnlab"`), learns to reverse digits in
a minute or two on a 2-core CPU. Then we look inside: its attention maps (from the fused kernel, not the
slow "eager" path), attention rollout and gradient-weighted relevance, the interactive viewer,
and the same views as static figures for a paper.

The task is sequence reversal as next-token prediction: the model reads 8 digits and a
separator `|`, then writes the digits backwards. To write answer digit i it has to look at input
digit 7 − i, and its maps should show exactly that.

`ATTNLAB_NOTEBOOK_SMALL=1` trains for a few steps only (the tests run it that way)."""),
    new_code_cell(parameters_cell("interpret", """
DIGITS = 8                            # length of the sequences to reverse
STEPS = 60 if SMALL else 350          # training steps of 128 sequences
OUT.mkdir(parents=True, exist_ok=True)""")),
    new_markdown_cell("""## A GPT-2 that attends through attnlab

Importing `attnlab.integrations.transformers` registers the `"attnlab"` attention implementation;
every attention layer of the model then runs through attnlab's operator, forward and backward.
Attention dropout is off: the fused operator has none (a model that asks for it in training mode
gets an error, not a silent difference)."""),
    new_code_cell("""%matplotlib inline
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
      f"attention: {model.config._attn_implementation}")"""),
    new_markdown_cell("""## Training

Fresh batches of 128 sequences; the loss counts the answer only (position `DIGITS + i`
predicts answer digit i)."""),
    new_code_cell("""def batch(n, generator=None):
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
print(f"digit accuracy on 2,000 fresh sequences: {100 * accuracy:.2f} %")"""),
    new_markdown_cell("""## The maps, from the fused kernel

`output_attentions=True` returns one `[batch, heads, query, key]` map per layer, computed by
attnlab's kernel in the same pass as the output. They equal what transformers' own "eager"
attention computes with the same weights (checked below)."""),
    new_code_cell("""example = test[:1]
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
attention_grid(out.attentions, tokens, title="GPT-2 through attnlab: every layer and head")"""),
    new_markdown_cell("""## Rollout and gradient relevance

A map shows one layer. *Attention rollout* (Abnar & Zuidema, 2020) multiplies the layers' maps
(with the residual connection) to say what each position draws on through the whole network.
*Gradient relevance* (Chefer et al., 2021) weighs each map by the gradient of one prediction with
respect to it; the gradient comes from attnlab's fused backward, which can hand back
∂loss/∂weights without building an autograd graph over them. Below: what the prediction of
answer digit 2 draws on. It should be input digit 5 (counting from 0). Both methods start from the
identity (the residual connection: every position draws on itself), so the position's own entry
is left out of the bars."""),
    new_code_cell("""position = DIGITS + 2                     # predicts answer digit 2 = input digit DIGITS - 3
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
figure.tight_layout()"""),
    new_markdown_cell("""## The viewer

One self-contained HTML page (no network, no CDN): hover over a token to see its links, pick a
layer and head, or switch to the model view. It shows inline here and is saved as a file."""),
    new_code_cell("""viewer = viz.head_view(out.attentions, tokens, title="GPT-2 reversing digits")
viewer.save(OUT / "interpret.html")
viewer"""),
    new_markdown_cell("""## For a paper

The same views as matplotlib figures: PNG, SVG or PDF."""),
    new_code_cell("""viz.static.model_view_figure(out.attentions, tokens).savefig(OUT / "model_view.pdf")
head_figure = viz.static.head_view_figure(out.attentions, tokens, layer=1, head="all")
head_figure.savefig(OUT / "head_view.svg")
print(sorted(p.name for p in OUT.iterdir()))
head_figure"""),
]

NOTEBOOKS = {"sparse_and": SPARSE_AND, "basics": BASICS, "interpret": INTERPRET}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="+", choices=sorted(NOTEBOOKS))
    parser.add_argument("--execute", action="store_true",
                        help="run each notebook in full mode and save it with its outputs")
    args = parser.parse_args()
    for name in args.names:
        notebook = new_notebook(cells=NOTEBOOKS[name], metadata={"kernelspec": {
            "display_name": "Python 3", "language": "python", "name": "python3"}})
        if args.execute:
            os.environ.pop("ATTNLAB_NOTEBOOK_SMALL", None)
            NotebookClient(notebook, timeout=3600, kernel_name="python3",
                           resources={"metadata": {"path": str(HERE.parent)}}).execute()
        nbformat.write(notebook, HERE / f"{name}.ipynb")
        print(f"wrote {HERE / f'{name}.ipynb'}")


if __name__ == "__main__":
    main()
