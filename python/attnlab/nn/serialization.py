"""Handing weights to the LibTorch modules (cpp/include/attnlab/modules.h)."""

import torch
from torch import nn


def save_for_cpp(module: nn.Module, path) -> None:
    """Saves ``module.state_dict()`` as a plain dict of CPU tensors, the form that LibTorch's
    ``attnlab::nn::load_state_dict`` reads (LibTorch cannot read the OrderedDict with metadata
    that ``state_dict()`` returns)."""
    torch.save({name: tensor.detach().cpu() for name, tensor in module.state_dict().items()},
               path)
