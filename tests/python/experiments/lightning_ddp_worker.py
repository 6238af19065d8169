"""Run by test_ddp.py as ``python lightning_ddp_worker.py MODE OUT``: trains the small reversal
task of ddp_worker.py with Lightning's ``Trainer(strategy="ddp", devices=2,
accelerator="cpu")``, which starts the second process itself (by running this script again),
and writes per process OUT/rank<r>.pt (the weights) and OUT/rank<r>.json.

MODE "train": train, with a checkpoint (OUT/last.ckpt) after every epoch; "stall": the same,
but in the second epoch, once the first epoch's checkpoint is written, process 0 writes
OUT/stalled and waits to be killed; "resume": go on from OUT/last.ckpt."""

import json
import sys
import time
from pathlib import Path

import lightning
import torch

sys.path.insert(0, str(Path(__file__).parent))
from ddp_worker import small_config  # noqa: E402

from attnlab.lightning import PredictorModule, task_loader  # noqa: E402
from attnlab.tasks import reverse  # noqa: E402
from attnlab.train import seed_everything  # noqa: E402


class Stall(lightning.Callback):
    """Stops process 0 (and with it, at the next gradient exchange, the other) mid-epoch."""

    def __init__(self, out: Path):
        self.out = out

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 5 and trainer.global_rank == 0:
            (self.out / "stalled").write_text("")
            time.sleep(600)


def main(mode: str, out: Path) -> None:
    torch.set_num_threads(1)
    config = small_config()
    task = reverse.make_task(config)
    module = PredictorModule.from_task(task, config.train)
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=out, save_last=True)
    trainer = lightning.Trainer(
        strategy="ddp", devices=2, accelerator="cpu", max_epochs=config.train.epochs,
        gradient_clip_val=config.train.grad_clip, logger=False, enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoints] + ([Stall(out)] if mode == "stall" else []))
    seed_everything(config.train.seed)
    trainer.fit(module, task_loader(task, seed=config.train.seed),
                ckpt_path=out / "last.ckpt" if mode == "resume" else None)
    rank = trainer.global_rank
    torch.save(task.model.state_dict(), out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "world_size": trainer.world_size, "global_step": trainer.global_step,
        "lr": trainer.optimizers[0].param_groups[0]["initial_lr"],
        "val": task.evaluate(task.model, "val"), "test": task.evaluate(task.model, "test")}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
