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
# # Set anomaly detection: attention compares the elements of a set
#
# Ten images, nine of one class and one of another: which one is the odd one out? The answer
# depends on the whole set (a sandal is the anomaly among boots, not among sandals), so the model
# must compare elements with each other, which is what self-attention does. It gets no
# positional encoding: a transformer without positions treats its input as a set, and its output
# follows any permutation of the elements. The anomaly can therefore always be stored last without
# giving anything away.
#
# This follows the UvA Deep Learning tutorial "Transformers and Multi-Head Attention" (Phillip
# Lippe), which uses CIFAR-100 with ImageNet ResNet-34 features. Here the images are
# Fashion-MNIST (Debian's `dataset-fashion-mnist`) and the frozen features come from a small CNN
# trained once on its training split. The model and recipe are the tutorial's: 4 layers, 4 heads,
# d = 256, dropout 0.1, no positions; as the tutorial's trainer does, the test figure is that of
# the epoch with the best validation accuracy. The full recipe runs 100 epochs of one set per training image
# (hours on a CPU); this notebook runs the fast configuration, 3 epochs of 6,400 sets (about two
# minutes on 2 cores), which already reaches about 95 % on the test sets; `ATTNLAB_NOTEBOOK_SMALL=1`
# runs a fifth of one epoch of it. `python3 -m attnlab anomaly --epochs 10` trains 10 epochs of the recipe
# from the command line. At the end the tutorial's own evaluation code (its `SetAnomalyDataset` and
# `AnomalyPredictor`, from `attnlab.tutorials.uvadl`) tests the trained weights on its own test
# sets.

# %%
# Parameters
import os
from pathlib import Path

SMALL = os.environ.get("ATTNLAB_NOTEBOOK_SMALL") == "1"
OUT = Path(os.environ.get("ATTNLAB_NOTEBOOK_OUT", "runs/notebook-anomaly" + ("-small" if SMALL else "")))
SEED = 0
EPOCHS = 1 if SMALL else 3   # of the fast configuration (6,400 sets an epoch)

# %%
# %matplotlib inline
import dataclasses
import torch
from attnlab import plot
from attnlab.tasks import anomaly
from attnlab.train import fit

config = anomaly.fast_config(SEED)
config.train = dataclasses.replace(config.train, epochs=EPOCHS)
if SMALL:  # a fifth of an epoch: enough to see every cell run
    config = dataclasses.replace(config, sets_per_epoch=1280)
config

# %% [markdown]
# ## Features and sets
#
# The first call trains the feature CNN (about a minute) and caches its 256-dimensional features;
# later calls read the cache. Validation sets come from the first 10 % of every class of the
# training split; training sets are drawn anew every epoch; validation and test sets are fixed.

# %%
task = anomaly.make_task(config, progress=False)
sets = task.examples["test_sets"]
print(len(sets), "test sets of", sets.shape[1], "images; feature size", task.examples["test_features"].shape[1])

# %% [markdown]
# ## Training
#
# Cross-entropy of the softmax over the set's ten elements, Adam with the cosine warm-up schedule,
# gradient clipping at 2. The checkpoint in `OUT` makes a second run of this cell instant.

# %%
result = fit(task, config.train, out_dir=OUT, progress=False)
for row in result["history"]:
    print(f"epoch {row['epoch']:3d}  train loss {row['train_loss']:.4f}  val accuracy {100 * row['accuracy']:.2f} %")
print(f"weights of epoch {result['selected_epoch']} ({result['selected_by']}): test accuracy "
      f"{100 * result['test']['accuracy']:.2f} %  (the tutorial, CIFAR-100 + ResNet-34, 100 epochs: 94.42 %)")
plot.training_curves(result["history"])

# %% [markdown]
# ## The attention of every layer and head on one test set
#
# Tick labels are the classes of the set's images; the anomaly is the last one. In the upper
# layers, some heads send nearly all the attention of every element to the anomaly.

# %%
maps, tokens = anomaly.attention_example(task)
plot.attention_grid(maps, tokens, title="attention on a test set (anomaly last)")

# %% [markdown]
# ## Sets and mistakes
#
# The anomaly is framed green; when the model picks another image, that one is framed red. The
# mistakes are mostly between classes that look alike: shirts, T-shirts, pullovers and coats.

# %%
figures = anomaly.extra_figures(task)
figures["sets"]

# %%
figures.get("mistakes", "no mistakes on the test sets")

# %%
# Permuting a set permutes the model's answer: the model sees a set, not a sequence.
model = task.model.eval()
x = task.examples["test_features"][sets[:64]]
perm = torch.randperm(10)
with torch.no_grad():
    p = model(x).squeeze(-1).softmax(-1)
    q = model(x[:, perm]).squeeze(-1).softmax(-1)
print("max |p[perm] - p(permuted)| =", (p[:, perm] - q).abs().max().item())

# %% [markdown]
# ## The tutorial's own evaluation code, on attnlab
#
# `attnlab.tutorials.uvadl.AnomalyPredictor` is the tutorial's Lightning module under its
# parameter names, which are attnlab's, so the weights trained above load into it as they are.
# The tutorial's `SetAnomalyDataset` then draws *its* test sets (one per test image, numpy seed
# 42, the anomaly last) and a Lightning `Trainer` tests the model on them, as the tutorial's
# `train_anomaly` does after reloading its best checkpoint. Its sets are other draws than
# attnlab's, so the figure differs a little from the one above.

# %%
import logging

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
print(f"Test accuracy on the tutorial's test sets: {(100.0 * test_result[0]['test_acc']):4.2f}%")
