"""Writes a Python attnlab encoder's state_dict, an input and the Python output into a folder,
for state_dict_check (C++) to load and compare. Configuration shared with state_dict_check.cpp:
TransformerEncoder(num_layers=2, input_dim=16, num_heads=4, dim_feedforward=32)."""

import os
import sys

import torch

from attnlab.nn import TransformerEncoder, save_for_cpp

folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
torch.manual_seed(0)
encoder = TransformerEncoder(num_layers=2, input_dim=16, num_heads=4, dim_feedforward=32).eval()
x = torch.randn(3, 9, 16)
mask = torch.ones(9, 9, dtype=torch.bool).tril()
save_for_cpp(encoder, os.path.join(folder, "encoder.pt"))
torch.save(x, os.path.join(folder, "input.pt"))
torch.save(mask, os.path.join(folder, "mask.pt"))
with torch.no_grad():
    torch.save(encoder(x, mask=mask), os.path.join(folder, "expected.pt"))
    torch.save(encoder.get_attention_maps(x, mask=mask)[1], os.path.join(folder, "maps.pt"))
