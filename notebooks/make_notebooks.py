"""Writes every notebook of notebooks/ from the cells below, the one way they are made:

    python notebooks/make_notebooks.py [NAME ...] [--execute]

With --execute each notebook is run in full mode (ATTNLAB_NOTEBOOK_SMALL unset) with nbclient and
saved with its outputs, which is how the committed notebooks are made; the tests re-run them in
small mode and check that their cells are the ones written here."""

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

This notebook follows the Neuromatch NeuroAI attention tutorial (W1D5, Tutorial 3) with `attnlab`:
a one-head self-attention model (SAT, 65 parameters, attention through
`attnlab.scaled_dot_product_attention`) against an MLP baseline (9,729 parameters), the
tutorial's results table over several seeds, its Exercise 3.4 (how many samples each model needs),
the rule task in which the last token decides which of two target sets counts, and the gain demo
that shows why larger scores make attention sparser. The last part runs **the tutorial's own
code** (its `SelfAttention`, `BinaryMLP`, `s_Sparse_AND_Query`, `make_train`, ... from
`attnlab.tutorials.neuromatch`) unchanged on attnlab.

`ATTNLAB_NOTEBOOK_SMALL=1` selects a small run (fewer epochs, seeds and sizes); the tests run it
that way."""),
    new_code_cell(parameters_cell("sparse-and", "\nSEEDS = 2 if SMALL else 5  # runs per row of the table")),
    new_code_cell("""%matplotlib inline
import torch
import attnlab
from attnlab import plot
from attnlab.tasks import sparse_and as sa
from matplotlib.figure import Figure

torch.set_num_threads(1)
config = sa.fast_config(SEEDS) if SMALL else sa.default_config(SEEDS)
rule_config = sa.rule_fast_config() if SMALL else sa.rule_default_config()
OUT.mkdir(parents=True, exist_ok=True)
config"""),
    new_markdown_cell("""## The data: which generator?

The tutorial's prose speaks of "the s-sparse AND", but all four runs behind its table draw their
data from its generator *with a rule token*, `s_Sparse_AND_Query(17, s)`: 16 bits, each 1 with
probability 0.5^(1/2), then a rule bit z; two disjoint target sets f₁, f₂ of s bits; the label is
the AND of f₁ when z = 0 and of f₂ when z = 1. The generator redraws the bits (up to 100 times)
until the label mean lies in [0.45, 0.55]. For s = 4 that can never happen (p⁴ = 0.25), and the
tutorial's generator silently keeps its last draw: its s = 4 data hold about 25 % positives. The
table below reproduces exactly that (`generator="rule-token"`, the default) and records each
draw's label mean. The plain s-sparse AND of the prose (every bit 1 with probability
0.5^(1/3), one target set, a window of [0.4, 0.6]) is a second, separately labelled table."""),
    new_code_cell("""for s in config.sparsities:
    generator = sa.make_generator(config, s, SEED)
    bits, labels = generator.sample(config.train_size)
    print(f"s = {s}: targets {[t.tolist() for t in generator.targets]}, label mean "
          f"{labels.mean():.3f}, label window met: {generator.last_sample['window_met']}")
plot.boolean_samples(bits, labels, sa.target_positions(generator),
                     title="s = 4 with a rule token (last column): samples, both target sets boxed")"""),
    new_markdown_cell("""## The two models

The SAT embeds each bit in 2 dimensions, adds a learned position, and runs one attention head
whose values are single numbers; a linear readout of the 17 attention outputs gives the logit.
The MLP sees the 17 bits directly. Both are trained full batch with Adam on the tutorial's loss,
`BCELoss` on the sigmoid outputs (SAT: lr 1e-2, 2000 epochs; MLP: lr 1e-3, 500 epochs); the
validation loss is the same `BCELoss`, whose log is clamped at −100 as the tutorial's is."""),
    new_code_cell("""for name, model in (("SAT", sa.SAT(config.seq_len)), ("MLP", sa.MLP(config.seq_len))):
    print(f"{name}: {sa.parameter_count(model):,} parameters")
    print(model, "\\n")"""),
    new_markdown_cell("""## The table over seeds

The tutorial's figures are one unseeded run per row; here every row is the mean ± std over
`SEEDS` seeds (the seed draws the targets, the samples and the initial weights; the SAT and the
MLP of a seed see the same data)."""),
    new_code_cell("""table = sa.results_table(config, first_seed=SEED, keep_runs=True)
print(sa.format_table(table["rows"], table["generator"]))
print(f"{sum(row['seconds'] for row in table['rows']):.1f} s of training")
figures = sa.table_figures(table)
for name, figure in figures.items():
    figure.savefig(OUT / f"{name}.png", dpi=120)
figures["results"]"""),
    new_markdown_cell("""With the rule token, the last token (the rule bit) is not where the SAT reads the targets:
its readout sums the attention outputs of all 17 positions, and the targets are found by the
queries of other positions. On the plain generator the last token itself looks at the targets
(below, in full mode, with the plain table)."""),
    new_code_cell("""if not SMALL:
    plain = sa.results_table(sa.default_config(SEEDS, generator="plain"), first_seed=SEED,
                             keep_runs=True)
    print(sa.format_table(plain["rows"], plain["generator"]))
    display(sa.table_figures(plain)["attention_s2"])"""),
    new_markdown_cell("""## Exercise 3.4: how many samples does each model need?

The tutorial asks the learner to raise the MLP's number of training samples until it reaches
100 % validation accuracy. Here both models run over a range of training-set sizes (s = 2, the
rule-token generator, the rest of the recipe unchanged), and for each seed we note the first size
at which the validation accuracy is 100 %. The command line does the same:
`python -m attnlab sparse-and --sample-complexity`."""),
    new_code_cell("""sizes = [50, 200] if SMALL else [25, 50, 100, 200, 400, 800, 1600]
sweep_seeds = list(range(SEED, SEED + (1 if SMALL else 3)))
sweep = sa.sample_complexity(config, sizes=sizes, seeds=sweep_seeds, sparsity=2)
print(sa.format_sample_complexity(sweep))
plot.sample_complexity(sweep)"""),
    new_markdown_cell("""## The rule task: attention that depends on the context

Now T = 11: ten bits and a rule bit z; f₁, f₂ of two bits each. The tutorial draws an "attention
graph": for every position i, Σⱼ scores[i, j] · linear.weight[j] — the softmax weights times the
readout — averaged over the positive samples of each rule among 200 fresh samples, as edges from
the inputs to the output. All edges share a common level (the readout's mean weight), so what
matters is which inputs stand out from it; the widths below show that departure. We count a
rule's targets as recovered when they are the two inputs that stand out most in its row."""),
    new_code_cell("""rule_seeds = list(range(SEED, SEED + (1 if SMALL else 5)))
rule_runs = [sa.run_rule_task(rule_config, seed=seed) for seed in rule_seeds]
rule_summary = sa.rule_seeds_summary(rule_runs, rule_config, rule_seeds)
print(sa.format_rule_seeds(rule_summary))
graph = plot.attention_graph(rule_runs[0]["edges"], rule_runs[0]["generator"].targets, centre=True,
                             title="Σⱼ scores[i, j]·readout[j], positive fresh samples "
                                   "(widths: departure from the row's median)")
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
    new_markdown_cell("""## The tutorial's own code, on attnlab

`attnlab.tutorials.neuromatch` gives the tutorial's classes and functions under its names; the
cells below are the tutorial's table runs with its definitions replaced by one import: four
`make_train` calls on `s_Sparse_AND_Query`, `results_dict`, `plot_compare`, the last token's
attention weights and the rule task's attention graph. (`make_train` returns the last draw for
s = 4 as the tutorial's generator does, and says so in a warning.) One seed; the small mode runs
fewer epochs."""),
    new_code_cell("""import warnings

from attnlab.tutorials.neuromatch import (BinaryMLP, SelfAttention, make_train,
                                          plot_attention_graph, plot_attention_weights,
                                          plot_compare, results_dict, s_Sparse_AND_Query, set_seed)

warnings.simplefilter("ignore", UserWarning)  # s = 4: the label window is never met (known)
set_seed(SEED)
context_length, B_t, B_valid = 17, 200, 500
sat_epochs, mlp_epochs = (300, 100) if SMALL else (2000, 500)
data_gen_sparse = s_Sparse_AND_Query(context_length, 2)
data_gen_dense = s_Sparse_AND_Query(context_length, 4)

sat_model_s = SelfAttention(context_length, 2)
results_sat_s = make_train(sat_model_s, data_gen_sparse, B_t, B_valid, sat_epochs, "cpu",
                           kind="SAT", etta=1e-2)
sat_model_d = SelfAttention(context_length, 2)
results_sat_d = make_train(sat_model_d, data_gen_dense, B_t, B_valid, sat_epochs, "cpu",
                           kind="SAT", etta=1e-2)
mlp_model_s = BinaryMLP(context_length, [512], 1)
results_mlp_s = make_train(mlp_model_s, data_gen_sparse, B_t, B_valid, mlp_epochs, "cpu",
                           kind="MLP", etta=1e-3)
mlp_model_d = BinaryMLP(context_length, [512], 1)
results_mlp_d = make_train(mlp_model_d, data_gen_dense, B_t, B_valid, mlp_epochs, "cpu",
                           kind="MLP", etta=1e-3)
results_dict(results_sat_d, results_sat_s, results_mlp_d, results_mlp_s)"""),
    new_code_cell("""plot_compare(results_sat_d, results_sat_s, results_mlp_d, results_mlp_s, B_t, B_t, B_t, B_t)"""),
    new_code_cell("""X_valid, y_valid = data_gen_sparse.generate(B_valid, verbose=False)
_, scores, _, _ = sat_model_s(X_valid, elaborate=True)
plot_attention_weights(scores, data_gen_sparse.f_i, context_length - 1, y_valid)"""),
    new_code_cell("""set_seed(SEED)
rule_gen = s_Sparse_AND_Query(11, 2)
rule_model = SelfAttention(11, 2)
results_rule = make_train(rule_model, rule_gen, 300, B_valid, 500 if SMALL else 1000, "cpu",
                          kind="SAT", etta=1e-2)
print(f"rule task: validation accuracy {results_rule[3]:.3f}")
plot_attention_graph(rule_model, rule_gen, 200)"""),
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

PERMUTATION = [
    new_markdown_cell("""\
# Permutation composition: attention that has to find a position

The input is two random permutations p₁ and p₂ of 0…9, one after the other (20 digits). At
output position n + i the model must say p₃[i] = p₁[p₂[i]]: read the digit p₂[i] under it,
go to *position* p₂[i] of the sequence, and copy what stands there. The first half of the target
is zeros and is not scored.

The model of the permutation-composition lab embeds the digits, adds a sinusoidal positional
encoding, runs an LSTM over the sequence and lets every LSTM output attend over the embedded
sequence; a linear layer turns what it reads into 10 logits. The keys are the embedded digits:
only the positional encoding lets a query ask for "position 7". Its base is 0.1 instead of the
usual 10000, which makes the 20 position codes nearly orthogonal, so that a query (bounded by
the LSTM's tanh) can single out one of them. Three attention kinds share one interface in
`attnlab.nn` — additive (Bahdanau), multiplicative (Luong) and scaled dot-product — and with
the autoregressive mask a query may only look at positions up to its own.

What we expect: with positions, every kind learns the task and row n + i of the attention map
points at column p₂[i]; without them the model cannot tell where p₂[i] is. One detail of the
recipe makes the second half of that hold in every seed: the output layer starts with the digit
embeddings as its rows. Why is shown below.

`ATTNLAB_NOTEBOOK_SMALL=1` runs a short version (one attention kind, short runs); the tests run
it that way."""),
    new_code_cell(parameters_cell("permutation")),
    new_code_cell("""\
%matplotlib inline
import dataclasses
import time

import torch
from attnlab import plot
from attnlab.tasks import permutation
from attnlab.train import fit

torch.set_num_threads(1)  # this small LSTM trains faster on one thread than on two busy ones
KINDS = ["scaled"] if SMALL else list(permutation.ATTENTION_KINDS)
base = permutation.fast_config(SEED) if SMALL else permutation.default_config(SEED)
if SMALL:
    base = dataclasses.replace(base, batches_per_epoch=150, test_size=1000)
base"""),
    new_markdown_cell("""\
## The data

The lab's example with n = 5, then a fresh batch with n = 10 as the model sees it."""),
    new_code_cell("""\
example = torch.tensor([[3, 4, 2, 1, 0, 1, 3, 0, 2, 4]])
print("input  ", example[0].tolist())
print("target ", permutation.composition_targets(example)[0].tolist())

inputs, targets = permutation.permutation_batch(64, 10, torch.Generator().manual_seed(SEED))
print("\\nbatch", tuple(inputs.shape))
print("p1 | p2 ", inputs[0].tolist())
print("target  ", targets[0].tolist())"""),
    new_markdown_cell("""\
## Training each attention kind (autoregressive, with positional encoding)

Every batch is drawn fresh (batch 64); Adam with the cosine warm-up schedule; the loss is the
cross-entropy over the p₃ half. Accuracy is per element of the p₃ half, measured on
fresh test sequences; `argmax_on_p2` is how often row n + i of the attention map has its
largest weight on column p₂[i]. Each run keeps a checkpoint under `OUT`, so running a cell again
resumes or just reloads."""),
    new_code_cell("""\
runs = {}
for kind in KINDS:
    config = dataclasses.replace(base, attention=kind, autoregressive=True)
    task = permutation.make_task(config)
    result = fit(task, config.train, out_dir=OUT / config.variant, progress=False)
    runs[kind] = (task, result)
    print(f"{kind:>14}: test accuracy {100 * result['test']['accuracy']:.2f} %, arg-max on p2 "
          f"{100 * result['test']['argmax_on_p2']:.2f} %, {result['seconds']:.0f} s of training")
plot.training_curves(runs[KINDS[0]][1]["history"])"""),
    new_markdown_cell("""\
## Where the queries look

One test sequence, its attention map per kind. Rows are queries (output positions), columns
keys (input positions), both labelled with the input digits; the red frames mark the cells
(n + i, p₂[i]) — where p₃[i] has to be read from. Rows in the first half are not trained and
look anywhere; with the autoregressive mask nothing lies above the diagonal."""),
    new_code_cell("""\
for kind, (task, result) in runs.items():
    display(permutation.marked_attention_figure(
        task.model, task.examples["attention"][0],
        title=f"{kind}: test accuracy {100 * result['test']['accuracy']:.2f} %"))"""),
    new_markdown_cell("""\
## A right answer without looking: the sign-flipped solution

The task has a second exact solution. p₁ and p₂ are permutations, so the sum of the 20 embedded
inputs is the same in every sequence. A query that puts *no* weight on position p₂[i] and equal
weight on the 19 others reads that constant sum minus the one value it avoided, and a linear
readout whose row for digit c points *away* from c's embedding names the missing digit. That
solution is the attending one with the signs of the query's positional part and of the readout
flipped, and at the start of training nothing prefers one over the other. With the output layer
started at PyTorch's default, about half the seeds end up there: high accuracy, and p₂[i] gets the
*least* weight of its row. Starting the output layer at the digit embeddings (each logit begins as
"how much of digit c did I read") tips every seed towards attending. Below, the same seeds with
both starts."""),
    new_code_cell("""\
seeds = [2] if SMALL else [0, 1, 2, 3, 4]
print("readout      seed  test accuracy  arg-max on p2  arg-min on p2  cos(readout_c, embedding_c)")
probe, _ = permutation.permutation_batch(1000, 10, torch.Generator().manual_seed(SEED + 7))
for readout in ("random", "embedding"):
    for seed in seeds:
        config = dataclasses.replace(base, attention="scaled", autoregressive=False,
                                     readout_init=readout,
                                     train=dataclasses.replace(base.train, seed=seed))
        task = permutation.make_task(config)
        result = fit(task, config.train, out_dir=OUT / "seeds" / f"{config.variant}-{seed}",
                     progress=False)
        weights = task.model.attention_map(probe)[:, 10:]
        argmin = (weights.argmin(-1) == probe[:, 10:]).float().mean().item()
        cosine = torch.nn.functional.cosine_similarity(task.model.output.weight,
                                                       task.model.embedding.weight, dim=1).mean()
        print(f"{readout:>10} {seed:6d} {100 * result['test']['accuracy']:12.2f} % "
              f"{100 * result['test']['argmax_on_p2']:12.1f} % {100 * argmin:12.1f} % {cosine:+14.2f}")"""),
    new_markdown_cell("""\
How often does row n + i put its largest weight on p₂[i]? Split by the digit to be read,
p₃[i], on fresh sequences, for the kinds trained above:"""),
    new_code_cell("""\
inputs, targets = permutation.permutation_batch(2000, 10, torch.Generator().manual_seed(SEED + 1))
print("digit to read:", " ".join(f"{d:4d}" for d in range(10)))
for kind, (task, _) in runs.items():
    hits = task.model.attention_map(inputs)[:, 10:].argmax(-1) == inputs[:, 10:]
    by_digit = [100 * hits[targets[:, 10:] == d].float().mean().item() for d in range(10)]
    print(f"{kind:>13}:", " ".join(f"{h:4.0f}" for h in by_digit))"""),
    new_markdown_cell("""\
## Without positional encoding

The same model with `position="none"`: the keys are the bare digit embeddings, and a digit
appears once in p₁ and once in p₂, so a query cannot tell the two halves apart, let alone find
position p₂[i]."""),
    new_code_cell("""\
config = dataclasses.replace(base, attention=KINDS[0], position="none", autoregressive=True)
plain_task = permutation.make_task(config)
plain = fit(plain_task, config.train, out_dir=OUT / config.variant, progress=False)
print(f"no positions ({KINDS[0]}): test accuracy {100 * plain['test']['accuracy']:.2f} %, "
      f"arg-max on p2 {100 * plain['test']['argmax_on_p2']:.2f} %")
permutation.marked_attention_figure(plain_task.model, plain_task.examples["attention"][0],
                                    title="no positional encoding")"""),
    new_markdown_cell("""\
## The lab's own code, on attnlab

`attnlab.tutorials.permutation_lab` gives the lab's names and its mask convention (True = the
query may *not* attend): `perm_generator`, `PositionalEncoder`, the attention layers,
`PermMultiplier`, and the lab's steps — plot the encoder's components, train, check the model on
five sequences. The lab's model has the same two solutions; the one line after building it
starts its readout at the embeddings, as attnlab's recipe does."""),
    new_code_cell("""\
from attnlab.tutorials.permutation_lab import (PermMultiplier, PositionalEncoder,
                                               ScaledDotProductAttention, check_model,
                                               perm_accuracy, perm_generator,
                                               plot_attention_map, plot_positional_encoder,
                                               train_perm_multiplier)

torch.manual_seed(SEED)
pos_enc = PositionalEncoder(32, max_len=50, scale=0.1, add=True)
plot_positional_encoder(pos_enc)"""),
    new_code_cell("""\
model = PermMultiplier(10, 32, 32, ScaledDotProductAttention(), pos_enc, autoregressive=True)
with torch.no_grad():  # the readout starts at the digit embeddings
    model.output.weight.copy_(model.embedding.weight)
    model.output.bias.zero_()
losses = train_perm_multiplier(model, 300 if SMALL else 1500, lr=3e-3)
print(f"last loss {losses[-1]:.4f}; accuracy on 1,000 fresh sequences {perm_accuracy(model):.3f}")
check_model(model)
sequence, _ = perm_generator(1, 10)
plot_attention_map(model, sequence[0])"""),
]


TEXT = [
    new_markdown_cell("""\
# Text classification: a one-layer transformer reads movie reviews

This follows the notebook "Self-Attention and the Transformer" of NYU Tandon's CS-GY 9223 Deep
Learning course. As there, reviews are lower-cased and split into words, cut or padded to 200 tokens and
mapped to the 50,000 most frequent training words (index 0 = unknown word, 1 = padding). The
classifier adds a learnable position table started at the sinusoids to the word embeddings,
runs one encoder layer built on the cross-style `attnlab.nn.MultiHeadAttention` (2 heads,
d = 32), takes the maximum of every feature over the sequence and maps it to two classes.
The reference, on IMDB's 25,000 + 25,000 reviews, is 80.9 % test accuracy.

IMDB cannot be downloaded on the machines this notebook was run on. Set `DATA` to an unpacked
`aclImdb` folder to train on it; otherwise the notebook writes a small corpus in the same layout
whose two classes use two different sets of sentiment words among neutral filler, and checks
that the model finds them. Two recipes train the same model: attnlab's improved one (the
position table learned, dropout, padding masked out, the cosine warm-up schedule) and the
notebook's own (`recipe="nyu"`: frozen sinusoids, no dropout, no padding mask, length-bucketed
batches, AdamW at a constant rate). The last part runs the notebook's own code (its
`TransformerClassifier`, `train` and `evaluate`, from `attnlab.tutorials.nyu`) on attnlab.
`ATTNLAB_NOTEBOOK_SMALL=1` makes everything smaller (the tests run it that way)."""),
    new_code_cell(parameters_cell("text") + """
DATA = None  # an aclImdb folder (train|test / pos|neg / *.txt); None: the demo corpus"""),
    new_code_cell("""\
%matplotlib inline
import dataclasses

import torch
from attnlab import plot
from attnlab.data import load_imdb
from attnlab.tasks import text
from attnlab.train import fit

torch.set_num_threads(1)  # a model this small trains faster on one thread than on two busy ones

if DATA is None:
    DATA = text.write_demo_corpus(OUT / "aclImdb", reviews_per_label=100 if SMALL else 500,
                                  seed=SEED)
corpus = load_imdb(DATA)
print({split: f"{len(texts)} reviews, {int(labels.sum())} positive"
       for split, (texts, labels) in corpus.items()})
review = corpus["train"][0][0]
print("\\n" + review)
print(text.tokenize(review))"""),
    new_markdown_cell("""\
## The recipe

On IMDB: the notebook's sizes and optimizer (AdamW at 1e-3, batch 164, 10 epochs; `fast_config`
in small mode) with attnlab's improved training details.
The demo corpus is a hundred times smaller: batches of 16 give it enough steps, and the small
mode trains at a higher rate (1e-2) for 4 epochs."""),
    new_code_cell("""\
config = text.fast_config(SEED) if SMALL else text.default_config(SEED)
config.data = str(DATA)
if len(corpus["train"][0]) < 5000:  # the demo corpus
    config = dataclasses.replace(config, batch_size=16)
    if SMALL:
        config.train = dataclasses.replace(config.train, lr=1e-2, epochs=4)
task = text.make_task(config)
vocabulary = task.examples["vocabulary"]
print(len(vocabulary), "tokens in the vocabulary, the most frequent:", vocabulary.words[2:12])
print(task.model)
print(sum(p.numel() for p in task.model.parameters()), "parameters")"""),
    new_markdown_cell("""\
## Training

10 % of the training reviews are held out for validation. The run keeps a checkpoint in
`OUT`: running the cell again resumes or reloads."""),
    new_code_cell("""\
result = fit(task, config.train, out_dir=OUT / "run", progress=False)
for row in result["history"]:
    print(f"epoch {row['epoch']:2d}  train loss {row['train_loss']:.4f}  "
          f"val accuracy {100 * row['accuracy']:.2f} %")
print(f"test accuracy {100 * result['test']['accuracy']:.2f} %, {result['seconds']:.0f} s of training")
plot.training_curves(result["history"])"""),
    new_markdown_cell("""\
## What the model picked up

Each word of the vocabulary on its own, as a one-word review: the words that push hardest
towards "positive" and towards "negative". On the demo corpus the sentiment words should come
out on top; a one-word review is far from anything seen in training, so a few neutral words
may slip in between."""),
    new_code_cell("""\
task.model.eval()
with torch.no_grad():
    words = torch.arange(2, len(vocabulary)).unsqueeze(1)   # every word, one per review
    logits = task.model(words)
    lean = logits[:, 1] - logits[:, 0]                     # > 0: positive
order = lean.argsort(descending=True)
print("most positive:", [vocabulary.words[2 + i] for i in order[:8].tolist()])
print("most negative:", [vocabulary.words[2 + i] for i in order[-8:].flip(0).tolist()])"""),
    new_markdown_cell("""\
## Attention on a test review

The first 24 tokens of the first test review, run on their own so the map stays readable:
one map per head, query on the y axis."""),
    new_code_cell("""\
maps, tokens = text.attention_example(task)
plot.attention_grid(maps, tokens, title="layer 1 on the start of a test review")"""),
    new_markdown_cell("""\
## The notebook's own recipe

`recipe="nyu"` trains the same model as the notebook does: the position table filled with the
sinusoids and frozen, no dropout (the notebook's `p` arguments are never used), no padding mask
(padding tokens are attended to and pooled over like words), batches of reviews of similar
length, AdamW at a constant learning rate without gradient clipping. Same data, same seed:"""),
    new_code_cell("""\
nyu_config = dataclasses.replace(config, recipe="nyu")
nyu_task = text.make_task(nyu_config)
nyu_result = fit(nyu_task, nyu_config.train, out_dir=OUT / "run-nyu", progress=False)
print(f"the notebook's recipe: test accuracy {100 * nyu_result['test']['accuracy']:.2f} %; "
      f"attnlab's: {100 * result['test']['accuracy']:.2f} %")
print("position table frozen:", not nyu_task.model.position_embedding.weight.requires_grad)
maps, tokens = text.attention_example(nyu_task)
plot.attention_grid(maps, tokens, title="the notebook's recipe: layer 1 on the start of a test review")"""),
    new_markdown_cell("""\
## The notebook's own code, on attnlab

`attnlab.tutorials.nyu` gives the notebook's classes and functions under its names: its
key–value lookup through `MultiHeadAttention.scaled_dot_product_attention`, its
`TransformerClassifier`, and its `train` and `evaluate`, which read the notebook's globals
`model` and `optimizer` as the notebook's do. The batches come from the encoded reviews above."""),
    new_code_cell("""\
from attnlab.tutorials.nyu import TransformerClassifier, evaluate, key_value_demo, train

lookup = key_value_demo()
for name in ("one_key", "two_keys", "three"):
    Q, H, A = lookup[name]
    print(f"query {Q[0, 0].tolist()} -> output {H[0, 0].round(decimals=2).tolist()}")"""),
    new_code_cell("""\
import torch.utils.data as data

vocabulary = task.examples["vocabulary"]
encoded = {split: (vocabulary.encode([text.tokenize(t) for t in texts], config.max_len), labels)
           for split, (texts, labels) in corpus.items()}
train_loader = data.DataLoader(data.TensorDataset(*encoded["train"]), batch_size=config.batch_size,
                               shuffle=True)
test_loader = data.DataLoader(data.TensorDataset(*encoded["test"]), batch_size=config.batch_size)

torch.manual_seed(SEED)
model = TransformerClassifier(num_layers=1, d_model=32, num_heads=2, conv_hidden_dim=128,
                              input_vocab_size=len(vocabulary), num_answers=2)
optimizer = torch.optim.AdamW(model.parameters(), lr=0.001)
history = train(train_loader, test_loader, epochs=2 if SMALL else 10)
evaluate(test_loader)"""),
]


REVERSE = [
    new_markdown_cell("""# Sequence reversal: watching one attention head learn to look backwards

The input is 16 digits, the target is the same digits in reverse order. Position *i* of the
output has to copy position *15 − i* of the input, so each output position needs information
from exactly one, distant, input position. A single self-attention head can do that if it
learns to point query *i* at key *15 − i*, and the positional encoding is what lets it
tell positions apart.

This notebook follows the UvA Deep Learning tutorial "Transformers and Multi-Head Attention"
(Phillip Lippe). It trains the tutorial's one-layer, one-head transformer with `attnlab`, checks
its accuracy against the tutorial's (100 % on validation and test) and draws the attention map,
which should come out as an anti-diagonal. The second half runs **the tutorial's own code**
(its `ReverseDataset`, `ReversePredictor`, `train_reverse` and `plot_attention_maps`, from
`attnlab.tutorials.uvadl`) unchanged on attnlab.

Set the environment variable `ATTNLAB_NOTEBOOK_SMALL=1` for a small run (seconds instead of
a minute); the tests run the notebook that way."""),
    new_code_cell(parameters_cell("reverse")),
    new_code_cell("""%matplotlib inline
import torch
import attnlab
from attnlab import plot
from attnlab.tasks import reverse
from attnlab.train import fit

torch.set_num_threads(1)  # a model this small trains faster on one thread than on two busy ones
config = reverse.fast_config(SEED) if SMALL else reverse.default_config(SEED)
config"""),
    new_markdown_cell("""## The data

Digits are one-hot encoded; the label of every position is a class out of 10. Training sets are
drawn once per seed; the last partial batch is dropped, as in the tutorial."""),
    new_code_cell("""task = reverse.make_task(config)
inputs, targets = next(iter(task.train_batches(0, torch.Generator().manual_seed(SEED))))
print("input shape", tuple(inputs.shape), "(batch, positions, one-hot)")
print("sequence:", inputs[0].argmax(-1).tolist())
print("target:  ", targets[0].tolist())"""),
    new_markdown_cell("""## The model

Input projection to 32 features, the sinusoidal positional encoding, one encoder block with a
single head (attention through `attnlab.scaled_dot_product_attention`), and a small output
network that predicts the digit at every position."""),
    new_code_cell("""print(task.model)
print(sum(p.numel() for p in task.model.parameters()), "parameters")"""),
    new_markdown_cell("""## Training

Adam with the cosine warm-up schedule, gradient clipping at 5, cross-entropy over every
position. As the tutorial's trainer does, the figures at the end are those of the epoch with
the best validation accuracy (the first one, on a tie), whose weights are reloaded. The run
keeps a checkpoint in `OUT`: running the cell again resumes from it, or just loads it when
training is complete."""),
    new_code_cell("""result = fit(task, config.train, out_dir=OUT, progress=False)
for row in result["history"]:
    print(f"epoch {row['epoch']:2d}  train loss {row['train_loss']:.4f}  val accuracy {100 * row['accuracy']:.2f} %")
print(f"weights of epoch {result['selected_epoch']} ({result['selected_by']}): "
      f"test accuracy {100 * result['test']['accuracy']:.2f} %  (the tutorial: 100.00 %)")
plot.training_curves(result["history"])"""),
    new_markdown_cell("""## What the head attends to

Rows are queries (output positions), columns are keys (input positions), both labelled with the
input digits; `origin="lower"` puts query 0 at the bottom. A trained model concentrates each
row on the column of the mirrored position, with some weight on its neighbours."""),
    new_code_cell("""maps, tokens = reverse.attention_example(task)
plot.attention_grid(maps, tokens, title="layer 1, head 1 on a test sequence")"""),
    new_code_cell("""# How sharp is it? For every query, where does the largest weight go?
argmax = maps[0][0, 0].argmax(-1)
print("query -> key with the most weight:", argmax.tolist())
print("mirror position for every query:", (argmax == torch.arange(15, -1, -1)).all().item())"""),
    new_markdown_cell("""## The tutorial's own code, on attnlab

`attnlab.tutorials.uvadl` gives the tutorial's names, signatures and mask convention (a query
may not attend where `mask == 0`), computing through attnlab's operator. The cells below are the
tutorial's, with its definitions replaced by one import: its worked example of
`scaled_dot_product` (seed 42), its data loaders, `train_reverse` (a Lightning `Trainer` that
keeps the checkpoint with the best `val_acc`) and `plot_attention_maps`. The small mode trains
on fewer sequences for 2 epochs."""),
    new_code_cell("""import logging
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
print("Q\\n", q)
print("K\\n", k)
print("V\\n", v)
print("Values\\n", values)
print("Attention\\n", attention)"""),
    new_code_cell("""CHECKPOINT_PATH = str(OUT / "tutorial")
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
print(f"Test accuracy: {(100.0 * reverse_result['test_acc']):4.2f}%")"""),
    new_code_cell("""data_input, labels = next(iter(val_loader))
inp_data = F.one_hot(data_input, num_classes=reverse_model.hparams.num_classes).float()
inp_data = inp_data.to(device)
attention_maps = reverse_model.get_attention_maps(inp_data)
plot_attention_maps(data_input, attention_maps, idx=0)"""),
]

ANOMALY = [
    new_markdown_cell("""# Set anomaly detection: attention compares the elements of a set

Ten images, nine of one class and one of another: which one is the odd one out? The answer
depends on the whole set (a sandal is the anomaly among boots, not among sandals), so the model
must compare elements with each other, which is what self-attention does. It gets no
positional encoding: a transformer without positions treats its input as a set, and its output
follows any permutation of the elements. The anomaly can therefore always be stored last without
giving anything away.

This follows the UvA Deep Learning tutorial "Transformers and Multi-Head Attention" (Phillip
Lippe), which uses CIFAR-100 with ImageNet ResNet-34 features. Here the images are
Fashion-MNIST (Debian's `dataset-fashion-mnist`) and the frozen features come from a small CNN
trained once on its training split. The model and recipe are the tutorial's: 4 layers, 4 heads,
d = 256, dropout 0.1, no positions; as the tutorial's trainer does, the test figure is that of
the epoch with the best validation accuracy. The full recipe runs 100 epochs of one set per training image
(hours on a CPU); this notebook runs the fast configuration, 3 epochs of 6,400 sets (about two
minutes on 2 cores), which already reaches about 95 % on the test sets; `ATTNLAB_NOTEBOOK_SMALL=1`
runs one epoch of it. `python3 -m attnlab anomaly --epochs 10` trains 10 epochs of the recipe
from the command line. At the end the tutorial's own evaluation code (its `SetAnomalyDataset` and
`AnomalyPredictor`, from `attnlab.tutorials.uvadl`) tests the trained weights on its own test
sets."""),
    new_code_cell(parameters_cell("anomaly", "\nEPOCHS = 1 if SMALL else 3   # of the fast configuration (6,400 sets an epoch)")),
    new_code_cell("""%matplotlib inline
import dataclasses
import torch
from attnlab import plot
from attnlab.tasks import anomaly
from attnlab.train import fit

config = anomaly.fast_config(SEED)
config.train = dataclasses.replace(config.train, epochs=EPOCHS)
config"""),
    new_markdown_cell("""## Features and sets

The first call trains the feature CNN (about a minute) and caches its 256-dimensional features;
later calls read the cache. Validation sets come from the first 10 % of every class of the
training split; training sets are drawn anew every epoch; validation and test sets are fixed."""),
    new_code_cell("""task = anomaly.make_task(config, progress=False)
sets = task.examples["test_sets"]
print(len(sets), "test sets of", sets.shape[1], "images; feature size", task.examples["test_features"].shape[1])"""),
    new_markdown_cell("""## Training

Cross-entropy of the softmax over the set's ten elements, Adam with the cosine warm-up schedule,
gradient clipping at 2. The checkpoint in `OUT` makes a second run of this cell instant."""),
    new_code_cell("""result = fit(task, config.train, out_dir=OUT, progress=False)
for row in result["history"]:
    print(f"epoch {row['epoch']:3d}  train loss {row['train_loss']:.4f}  val accuracy {100 * row['accuracy']:.2f} %")
print(f"weights of epoch {result['selected_epoch']} ({result['selected_by']}): test accuracy "
      f"{100 * result['test']['accuracy']:.2f} %  (the tutorial, CIFAR-100 + ResNet-34, 100 epochs: 94.42 %)")
plot.training_curves(result["history"])"""),
    new_markdown_cell("""## The attention of every layer and head on one test set

Tick labels are the classes of the set's images; the anomaly is the last one. In the upper
layers, some heads send nearly all the attention of every element to the anomaly."""),
    new_code_cell("""maps, tokens = anomaly.attention_example(task)
plot.attention_grid(maps, tokens, title="attention on a test set (anomaly last)")"""),
    new_markdown_cell("""## Sets and mistakes

The anomaly is framed green; when the model picks another image, that one is framed red. The
mistakes are mostly between classes that look alike: shirts, T-shirts, pullovers and coats."""),
    new_code_cell("""figures = anomaly.extra_figures(task)
figures["sets"]"""),
    new_code_cell("""figures.get("mistakes", "no mistakes on the test sets")"""),
    new_code_cell("""# Permuting a set permutes the model's answer: the model sees a set, not a sequence.
model = task.model.eval()
x = task.examples["test_features"][sets[:64]]
perm = torch.randperm(10)
with torch.no_grad():
    p = model(x).squeeze(-1).softmax(-1)
    q = model(x[:, perm]).squeeze(-1).softmax(-1)
print("max |p[perm] - p(permuted)| =", (p[:, perm] - q).abs().max().item())"""),
    new_markdown_cell("""## The tutorial's own evaluation code, on attnlab

`attnlab.tutorials.uvadl.AnomalyPredictor` is the tutorial's Lightning module under its
parameter names, which are attnlab's, so the weights trained above load into it as they are.
The tutorial's `SetAnomalyDataset` then draws *its* test sets (one per test image, numpy seed
42, the anomaly last) and a Lightning `Trainer` tests the model on them, as the tutorial's
`train_anomaly` does after reloading its best checkpoint. Its sets are other draws than
attnlab's, so the figure differs a little from the one above."""),
    new_code_cell("""import logging

import lightning as L
import torch.utils.data as data
from attnlab.tutorials.uvadl import AnomalyPredictor, SetAnomalyDataset

logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
features = anomaly.load_features(config, progress=False)
test_feats, test_labels = features["test"]
if SMALL:  # the first 100 test images of each class (the dataset wants equal classes)
    keep = torch.argsort(test_labels, stable=True).reshape(10, -1)[:, :100].flatten()
    test_feats, test_labels = test_feats[keep], test_labels[keep]
test_anom_dataset = SetAnomalyDataset(test_feats, test_labels, set_size=10, train=False)
test_anom_loader = data.DataLoader(test_anom_dataset, batch_size=64, shuffle=False,
                                   drop_last=False)
anomaly_model = AnomalyPredictor(input_dim=test_feats.shape[1], model_dim=256, num_heads=4,
                                 num_classes=1, num_layers=4, dropout=0.1, input_dropout=0.1,
                                 lr=5e-4, warmup=100, max_iters=1)
anomaly_model.load_state_dict(task.model.state_dict())
trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                    enable_model_summary=False)
test_result = trainer.test(anomaly_model, dataloaders=test_anom_loader, verbose=False)
print(f"Test accuracy on the tutorial's test sets: {(100.0 * test_result[0]['test_acc']):4.2f}%")"""),
]


SPARSE_ATTENTION = [
    new_markdown_cell("""\
# Sparse attention you can see: softmax, entmax-1.5, sparsemax and hard attention

Attention turns each query's scores z₁…z_K into weights that sum to 1. How it does that decides
what the map can look like:

- **softmax**: p_j = exp(z_j) / Σ exp(z_k). Every key gets a weight > 0, however small, so a map
  is never exactly one-hot; "the model looks at key 3" always means "mostly at key 3".
- **sparsemax** (Martins & Astudillo, 2016): the Euclidean projection of z onto the probability
  simplex, p_j = [z_j − τ]₊ with the threshold τ that makes the weights sum to 1. Keys whose
  score is more than a margin below the best get *exactly* 0.
- **1.5-entmax** (Peters, Niculae & Martins, 2019): p_j = [z_j/2 − τ]₊², between the two: smooth
  near the top like softmax, exact zeros in the tail like sparsemax. Both are differentiable
  almost everywhere, so they train with plain backpropagation.
- **hard attention**: a one-hot vector on the arg-max key. It is what "the model looks there"
  means literally, but its gradient with respect to the scores is zero almost everywhere, so it
  is not trained this way; below it is applied to a softmax-trained model after training, as
  the NYU notebook's contrast between soft and hard attention does.

attnlab's operator takes the normalizer as an argument (`normalizer="softmax" | "sparsemax" |
"entmax15" | "entmax"`), and so do its modules and the experiments (`--normalizer`). This
notebook trains the tutorials' models with each and puts their maps side by side; cells that are
exactly 0 are drawn **white**.

`ATTNLAB_NOTEBOOK_SMALL=1` selects a small run (a few seconds of training per model); the tests
run it that way."""),
    new_code_cell(parameters_cell("sparse-attention")),
    new_code_cell("""\
%matplotlib inline
import dataclasses

import torch
import attnlab
from attnlab import plot
from attnlab.tasks import permutation, reverse
from attnlab.train import fit

torch.set_num_threads(1)  # these small models train faster on one thread than on two busy ones
NORMALIZERS = ["softmax", "entmax15", "sparsemax"]"""),
    new_markdown_cell("""\
## One row of scores, four normalizers

The same scores for eight keys, through the operator: a query q = [1] and keys k_j = [z_j] give
the scores z_j with `scale=1`. Softmax spreads weight over every key; entmax-1.5 and sparsemax
keep the top few and give the rest exactly 0; hard attention keeps one."""),
    new_code_cell("""\
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
                 title="weights of one query over eight keys (key labels: their scores)")"""),
    new_markdown_cell("""\
## Sequence reversal: most of the map becomes exactly zero

The UvA tutorial's task (16 digits, output position i copies input position 15 − i) with its
one-layer, one-head transformer, trained once per normalizer with the same seed and data (the
`--fast` recipe; `python -m attnlab reverse --fast --normalizer sparsemax` on the command line).
`attention_zero_fraction` is the fraction of the test maps' weights (every layer, head, query
and key) that are exactly 0."""),
    new_code_cell("""\
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
          f"{result['seconds']:.0f} s of training")"""),
    new_markdown_cell("""\
The maps of one test sequence. "hard" is the softmax model's map with each row replaced by a
one-hot vector on its arg-max. The red frames mark the mirrored positions (i, 15 − i)."""),
    new_code_cell("""\
maps = {}
for normalizer, (task, _) in reversal.items():
    layer_maps, tokens = reverse.attention_example(task)
    maps[normalizer] = layer_maps[0][0, 0]
soft = maps["softmax"]
maps["hard (softmax's arg-max)"] = torch.nn.functional.one_hot(soft.argmax(-1), soft.shape[-1]).float()
length = len(tokens)
plot.attention_side_by_side(maps, tokens, tokens, marked=[(i, length - 1 - i) for i in range(length)],
                            title="sequence reversal: one test sequence")"""),
    new_code_cell("""\
digits = torch.randint(10, (500, 16), generator=torch.Generator().manual_seed(SEED + 5))
inputs = reverse.one_hot(digits, 10)
mirror = torch.arange(15, -1, -1)
for normalizer, (task, _) in reversal.items():
    weights = task.model.get_attention_maps(inputs)[0][:, 0]          # [B, L, L]
    on_mirror = weights[:, torch.arange(16), mirror]
    print(f"{normalizer:>9}: keys kept per row {(weights > 0).sum(-1).float().mean():5.2f} of 16, "
          f"weight on the mirrored key {on_mirror.mean():.3f}, rows exactly one-hot on it "
          f"{100 * (on_mirror == 1).float().mean():5.1f} %")"""),
    new_markdown_cell("""\
Sparsemax and 1.5-entmax zero most of each row: a row keeps the mirrored position and a couple of
its neighbours, and the tail that softmax spreads over every other key is gone. The rows are not
one-hot, though: sparsemax gives a row a single key only when its score leads the runner-up by at
least 1 (1.5-entmax: by at least 2), and once the model answers right the loss has little reason
to push the scores that far apart.

**Hard attention on the trained softmax model.** A boolean mask with a single allowed key per row
makes the operator's softmax exactly one-hot, so passing the arg-max map as the mask runs the
softmax model with hard attention:"""),
    new_code_cell("""\
task, result = reversal["softmax"]
with torch.no_grad():
    task.model.eval()
    soft_map = task.model.get_attention_maps(inputs)[0]               # [B, 1, L, L]
    hard_mask = torch.nn.functional.one_hot(soft_map.argmax(-1), 16).bool()
    soft_acc = (task.model(inputs).argmax(-1) == digits.flip(1)).float().mean()
    hard_acc = (task.model(inputs, mask=hard_mask).argmax(-1) == digits.flip(1)).float().mean()
print(f"softmax model, its own soft attention: {100 * soft_acc:.2f} %; "
      f"with hard (arg-max) attention: {100 * hard_acc:.2f} %")"""),
    new_markdown_cell("""\
## Permutation composition: rows that pick exactly p₂[i]

The permutation-composition lab's task: inputs p₁ then p₂, and output position n + i must say
p₁[p₂[i]], read at input position p₂[i]. The LSTM + attention model with positions added and the
autoregressive mask, trained once per normalizer with two kinds of scores: **scaled**
dot-product qᵀk/√32 (the experiment's main row) and **multiplicative** qᵀk (Luong's, unscaled:
the same model with scores √32 ≈ 5.7 times larger). Here the zero fraction counts the answer
rows n + i only (the rows the loss uses), over the keys the autoregressive mask leaves open:
masked keys are 0 under every normalizer."""),
    new_code_cell("""\
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
              f"{100 * result['test']['attention_zero_fraction']:5.1f} %, {result['seconds']:.0f} s")"""),
    new_code_cell("""\
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
        title=f"{kind} attention: framed (n + i, p₂[i]); white = exactly 0 (above the diagonal: masked)"))"""),
    new_code_cell("""\
inputs, _ = permutation.permutation_batch(2000, n, torch.Generator().manual_seed(SEED + 3))
for (kind, normalizer), (task, _) in composition.items():
    answers = task.model.attention_map(inputs)[:, n:]                 # rows n + i
    on_p2 = answers.gather(-1, inputs[:, n:, None]).squeeze(-1)       # the weight on p2[i]
    print(f"{kind:>14} {normalizer:>9}: keys kept per answer row {(answers > 0).sum(-1).float().mean():5.2f}, "
          f"weight on p2[i] {on_p2.mean():.3f}, rows exactly one-hot on p2[i] "
          f"{100 * (on_p2 == 1).float().mean():5.1f} %")"""),
    new_markdown_cell("""\
## What the maps show

- Softmax maps are dense: even a model that answers every test sequence right leaves weight on
  every open key; its exact-zero fraction is 0 and no row is one-hot.
- Sparsemax and 1.5-entmax reach the same accuracy with maps in which many weights are exact
  zeros; how many depends on the normalizer (sparsemax is the sparser) and on how far apart the
  scores are (the counts above).
- Whether a row becomes *exactly* one-hot depends on how far apart the scores get. With the
  scaled scores (queries from a tanh-bounded LSTM, divided by √32) the gap stays below
  sparsemax's threshold of 1 and the rows keep several keys, p₂[i] the heaviest; the unscaled
  multiplicative scores cross it, and sparsemax then puts all of a row's weight on p₂[i] in most
  rows: hard attention, trained by gradient descent.
- Hard attention applied to the softmax model keeps its answers here because its soft maps
  already peak at the right key; the sparse normalizers make that visible in the weights
  themselves instead of after an arg-max.

The same comparison over five seeds, with the set-anomaly task too, is on the documentation's
page *Sparse attention* (`docs/experiments/sparse-attention.md`)."""),
]


NOTEBOOKS = {"basics": BASICS, "reverse": REVERSE, "anomaly": ANOMALY,
             "sparse_and": SPARSE_AND, "permutation": PERMUTATION, "text": TEXT,
             "interpret": INTERPRET, "sparse_attention": SPARSE_ATTENTION}


def build(name: str):
    """The notebook ``name`` as nbformat builds it from the cells above, not yet executed."""
    return new_notebook(cells=[cell.copy() for cell in NOTEBOOKS[name]], metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})


def main() -> None:
    """Writes the notebooks named on the command line (all of them by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"notebooks to write (default all: {', '.join(NOTEBOOKS)})")
    parser.add_argument("--execute", action="store_true",
                        help="run each notebook in full mode and save it with its outputs")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"unknown notebook(s) {', '.join(unknown)}; choose among "
                     f"{', '.join(NOTEBOOKS)}")
    for name in args.names or list(NOTEBOOKS):
        notebook = build(name)
        if args.execute:
            os.environ.pop("ATTNLAB_NOTEBOOK_SMALL", None)
            NotebookClient(notebook, timeout=3600, kernel_name="python3",
                           resources={"metadata": {"path": str(HERE.parent)}}).execute()
        nbformat.write(notebook, HERE / f"{name}.ipynb")
        print(f"wrote {HERE / f'{name}.ipynb'}")


if __name__ == "__main__":
    main()
