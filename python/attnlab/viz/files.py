"""Attention maps on disk: the ``attention_maps.pt`` an experiment writes into its run folder,
which ``python -m attnlab view RUN_DIR`` reads."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ._data import prepare

FILE_NAME = "attention_maps.pt"
FORMAT = "attnlab-attention-maps"


def save_maps(path, maps, tokens, key_tokens=None, *, title: str | None = None) -> Path:
    """Writes ``maps`` (one ``[batch, heads, queries, keys]`` tensor per layer) and their
    tokens to ``path`` with ``torch.save``, atomically (a temporary file, then a rename).
    The input is checked as the viewers check it; :func:`load_maps` reads the file back."""
    data = prepare(maps, tokens, key_tokens)  # the same checks as the viewers
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    path = Path(path)
    content = {
        "format": FORMAT, "version": 1, "title": title,
        "maps": [torch.as_tensor(m).detach().to("cpu", torch.float32).contiguous() for m in maps],
        "tokens": data.query_tokens, "key_tokens": data.key_tokens if data.cross else None,
    }
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(content, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path


def load_maps(path) -> dict:
    """Reads a file written by :func:`save_maps` (or a run folder holding
    ``attention_maps.pt``): ``{"maps": tuple of tensors, "tokens": one list of strings per
    batch entry, "key_tokens": the same or None, "title": str or None}``. Raises
    FileNotFoundError when it is missing and ValueError when it is not such a file."""
    path = Path(path)
    if path.is_dir():
        folder, path = path, path / FILE_NAME
        if not path.exists():
            raise FileNotFoundError(
                f"{folder} has no {FILE_NAME}; experiments write it at the end of a run "
                f"(reverse, anomaly, permutation, text). For a run made before they did, run "
                f"the same experiment command again with --out {folder}: it resumes from "
                f"checkpoint.pt, finishes at once and writes the file")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises a variety of errors for foreign files
        raise ValueError(f"{path} is not an attention-maps file written by attnlab "
                         f"({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise ValueError(f"{path} is not an attention-maps file written by attnlab.viz.save_maps")
    if not isinstance(content.get("maps"), (list, tuple)) or "tokens" not in content:
        raise ValueError(f"{path} lacks its maps or tokens")
    result = {"maps": tuple(content["maps"]), "tokens": content["tokens"],
              "key_tokens": content.get("key_tokens"), "title": content.get("title")}
    try:
        prepare(result["maps"], result["tokens"], result["key_tokens"])
    except (TypeError, ValueError) as error:
        raise ValueError(f"{path} holds damaged maps: {error}") from None
    return result
