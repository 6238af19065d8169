"""Run by test_ddp.py under torchrun (``python -m torch.distributed.run --nproc-per-node 2
ddp_worker.py MODE OUT``): trains a small reversal task with ``attnlab.train.fit`` and writes,
per process, what the tests compare into OUT/rank<r>.json and OUT/rank<r>.pt.

MODE "train": first one backward pass of DistributedDataParallel on a copy of the model, to
compare with the processes' own gradients (OUT/rank<r>_gradients.pt), then train,
checkpointing into OUT; "slow": the same, each batch after the first epoch slowed by 50 ms
(which changes no result) so that a kill lands mid-epoch; "cli": ``attnlab reverse --fast
--quiet --out OUT`` with small_config() in place of the --fast configuration."""

import copy

import json
import sys
import time
from pathlib import Path

import torch

from attnlab.tasks import reverse
from attnlab.train import TrainConfig, fit, process_group, world

BATCH = 64


def small_config(batch_size=BATCH, lr=5e-4, warmup=10):
    """40 batches of 64 per epoch: 20 steps per process with two processes."""
    return reverse.ReverseConfig(train_size=40 * 64, val_size=300, test_size=301,
                                 batch_size=batch_size,
                                 train=TrainConfig(epochs=3, lr=lr, warmup=warmup, seed=7))


def train(out: Path, slow: bool) -> None:
    task = reverse.make_task(small_config())
    with process_group(torch.device("cpu")) as (rank, _):  # fit uses this group
        gradients(copy.deepcopy(task), rank, out)
        _train(task, out, slow)


def _train(task, out: Path, slow: bool) -> None:
    block = task.model.transformer.layers[0]
    sample = task.model.embed(reverse.one_hot(torch.zeros(2, 16, dtype=torch.long), 10))
    fused = block._fusable(sample, None)  # the fused encoder operator trains this model
    if slow:
        batches = task.train_batches

        def slowed(epoch, generator):
            for batch in batches(epoch, generator):
                if epoch > 0:
                    time.sleep(0.05)
                yield batch
        task.train_batches = slowed
    result = fit(task, small_config().train, out_dir=out, progress=False)
    rank = world()[0]
    torch.save(task.model.state_dict(), out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "fused": fused, "seed": torch.initial_seed(), **{key: result[key] for key in (
            "history", "val", "test", "world_size", "device", "lr", "warmup_steps",
            "steps_per_epoch")}}))


def gradients(task, rank: int, out: Path) -> None:
    """Each process's own gradient of its first batch, without DDP, and the gradient DDP leaves
    after the same backward pass: the latter must be the mean of the former over processes.
    On a copy of the task: the training run is not touched."""
    inputs, targets = list(task.train_batches(0, torch.Generator().manual_seed(0)))[rank]
    model = task.model.train()
    task.loss(model(inputs), targets).backward()
    own = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    task.loss(ddp(inputs), targets).backward()
    synced = {name: p.grad.clone() for name, p in model.named_parameters()}
    torch.save({"own": own, "synced": synced}, out / f"rank{rank}_gradients.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode, out = sys.argv[1], Path(sys.argv[2])
    if mode == "cli":
        from attnlab import cli
        reverse.fast_config = lambda seed=0: small_config()
        sys.exit(cli.main(["reverse", "--fast", "--quiet", "--out", str(out)]))
    out.mkdir(parents=True, exist_ok=True)
    train(out, slow=mode == "slow")
