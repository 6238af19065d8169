"""Prints what a GPU run's results depend on: Python, torch, CUDA, cuDNN, the GPU, attnlab's
build, and the backend torch's F.scaled_dot_product_attention picks by default.

    python3 benchmarks/gpu/env_info.py

Needs only torch; attnlab's line says so when it is not installed."""

import importlib.metadata
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import default_backend  # noqa: E402


def main():
    print(f"python {platform.python_version()} ({sys.executable})")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {cudnn}")
    packages = []
    for name in ("numpy", "tqdm", "matplotlib", "pytest", "hypothesis", "expecttest",
                 "scikit-build-core", "pybind11", "cmake", "ninja"):
        try:
            packages.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            packages.append(f"{name} MISSING")
    print("packages:", ", ".join(packages))
    try:
        import attnlab
        print(f"attnlab {attnlab.__version__} at {Path(attnlab.__file__).parent}: "
              f"{attnlab.build_info()}")
    except Exception as error:  # not built yet, or a broken build: say which
        print(f"attnlab: not importable ({type(error).__name__}: {error})")
    if not torch.cuda.is_available():
        print("CUDA device: none visible to torch")
        return 1
    props = torch.cuda.get_device_properties(0)
    print(f"GPU 0: {props.name}, {props.total_memory / 2**30:.1f} GiB, "
          f"{props.multi_processor_count} SMs, compute capability {props.major}.{props.minor}")
    print(f"TF32 matmuls allowed: {torch.backends.cuda.matmul.allow_tf32}")
    print("torch's default SDPA backend, (B, H, L, D) with B·L = 16k tokens and H·D = 2048:")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for length, head_size in ((4096, 64), (4096, 128), (1024, 64)):
            batch, heads = 16 * 1024 // length, 2048 // head_size
            q, k, v = (torch.randn(batch, heads, length, head_size, device="cuda", dtype=dtype)
                       for _ in range(3))
            for is_causal in (False, True):
                print(f"  {str(dtype).removeprefix('torch.'):8} ({batch}, {heads}, {length}, "
                      f"{head_size}) causal={is_causal!s:5}: {default_backend(q, k, v, is_causal)}")
            del q, k, v
    return 0


if __name__ == "__main__":
    sys.exit(main())
