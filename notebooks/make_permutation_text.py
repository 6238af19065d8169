"""Writes notebooks/permutation.ipynb and notebooks/text.ipynb with nbformat and, with
--execute, runs them in full mode so they are committed with their outputs.

    python notebooks/make_permutation_text.py --execute
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).parent


def parameters(name: str) -> str:
    return f'''# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-{name}" + ("-small" if SMALL else "")))
SEED = 0'''


PERMUTATION = [
    new_markdown_cell("""\
# Permutation composition: attention that has to find a position

The input is two random permutations p₁ and p₂ of 0…9, one after the other (20 digits). At
output position n + i the model must say p₃[i] = p₁[p₂[i]]: read the digit p₂[i] under it,
go to *position* p₂[i] of the sequence, and copy what stands there. The first half of the target
is zeros and is not scored.

The model of the permutation-composition lab embeds the digits, adds a sinusoidal positional encoding, runs an LSTM
over the sequence and lets every LSTM output attend over the embedded sequence; a linear layer
turns what it reads into 10 logits. The keys are the embedded digits: only the positional
encoding lets a query ask for "position 7". Its base is 0.1 instead of the usual 10000, which
makes the 20 position codes nearly orthogonal, so that a query (bounded by the LSTM's tanh)
can single out one of them. Three attention kinds share one interface in
`attnlab.nn` — additive (Bahdanau), multiplicative (Luong) and scaled dot-product — and with
the autoregressive mask a query may only look at positions up to its own.

What we expect: with positions, every kind learns the task and row n + i of the attention map
points at column p₂[i]; without them the model cannot tell where p₂[i] is.

`ATTNLAB_NOTEBOOK_SMALL=1` runs a short version (one attention kind, short runs); the tests run
it that way."""),
    new_code_cell(parameters("permutation")),
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
    started = time.perf_counter()
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
How often does row n + i put its largest weight on p₂[i]? Split by the digit to be read,
p₃[i], on fresh sequences:"""),
    new_code_cell("""\
inputs, targets = permutation.permutation_batch(2000, 10, torch.Generator().manual_seed(SEED + 1))
print("digit to read:", " ".join(f"{d:4d}" for d in range(10)))
for kind, (task, _) in runs.items():
    hits = task.model.attention_map(inputs)[:, 10:].argmax(-1) == inputs[:, 10:]
    by_digit = [100 * hits[targets[:, 10:] == d].float().mean().item() for d in range(10)]
    print(f"{kind:>13}:", " ".join(f"{h:4.0f}" for h in by_digit))"""),
    new_markdown_cell("""\
A model can be right without looking at p₂[i]. In our full run the additive model answers
every element correctly, yet for three of the ten digits its rows look *away* from the
position that holds the answer and spread their weight over the other positions of p₁. That
works because p₁ is a permutation: the sum of all ten digit embeddings is the same in every
sequence, so a mixture of all the others, minus what is known to be there, names the missing
digit. The dot-product kinds read the answer directly."""),
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
]


TEXT = [
    new_markdown_cell("""\
# Text classification: a one-layer transformer reads movie reviews

As in the NYU self-attention notebook, reviews are lower-cased and split into words, cut or padded to 200 tokens and
mapped to the 50,000 most frequent training words (index 0 = unknown word, 1 = padding). The
classifier adds a learnable position table started at the sinusoids to the word embeddings,
runs one encoder layer built on the cross-style `attnlab.nn.MultiHeadAttention` (2 heads,
d = 32), takes the maximum of every feature over the sequence and maps it to two classes.
The reference, on IMDB's 25,000 + 25,000 reviews, is 80.9 % test accuracy.

IMDB cannot be downloaded on the machines this notebook was run on. Set `DATA` to an unpacked
`aclImdb` folder to train on it; otherwise the notebook writes a small corpus in the same layout
whose two classes use two different sets of sentiment words among neutral filler, and checks
that the model finds them. `ATTNLAB_NOTEBOOK_SMALL=1` makes everything smaller (the tests run
it that way)."""),
    new_code_cell(parameters("text") + """
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

On IMDB: the notebook's recipe (AdamW at 1e-3, batch 164, 10 epochs; `fast_config` in small mode).
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
]


def write(name: str, cells: list, execute: bool) -> None:
    notebook = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})
    if execute:
        os.environ.pop("ATTNLAB_NOTEBOOK_SMALL", None)
        NotebookClient(notebook, timeout=3600, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE.parent)}}).execute()
    nbformat.write(notebook, HERE / f"{name}.ipynb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execute", action="store_true", help="run them in full mode first")
    parser.add_argument("--only", choices=("permutation", "text"), help="one of the two")
    args = parser.parse_args()
    for name, cells in (("permutation", PERMUTATION), ("text", TEXT)):
        if args.only in (None, name):
            write(name, cells, args.execute)


if __name__ == "__main__":
    main()
