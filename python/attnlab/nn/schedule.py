"""The cosine learning-rate schedule with linear warm-up, stepped every iteration."""

from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR


class CosineWarmupScheduler(LambdaLR):
    """factor(it) = 0.5·(1 + cos(π·it / max_iters)), times it / warmup while it <= warmup."""

    def __init__(self, optimizer, warmup: int, max_iters: int):
        if warmup <= 0 or max_iters <= 0:
            raise ValueError(f"warmup and max_iters must be positive, got {warmup}, {max_iters}")
        self.warmup = warmup
        self.max_num_iters = max_iters
        super().__init__(optimizer, self.get_lr_factor)

    def get_lr_factor(self, epoch: int) -> float:
        factor = 0.5 * (1 + math.cos(math.pi * epoch / self.max_num_iters))
        if epoch <= self.warmup:
            factor *= epoch / self.warmup
        return factor
