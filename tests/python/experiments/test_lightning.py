"""The Lightning wrapper of the predictor: a few steps with Lightning's Trainer."""

import pytest
import torch

lightning = pytest.importorskip("lightning", reason="Lightning is optional (pip install lightning)")

from attnlab.lightning import PredictorModule, task_loader  # noqa: E402
from attnlab.tasks import reverse  # noqa: E402
from attnlab.train import TrainConfig, fit, seed_everything  # noqa: E402


def small_config():
    return reverse.ReverseConfig(train_size=128 * 100, val_size=512, test_size=256,
                                 train=TrainConfig(epochs=2, lr=5e-3, warmup=20, seed=0))


def test_trainer_learns_as_attnlab_loop_does():
    config = small_config()
    reference = fit(reverse.make_task(config), config.train, progress=False)

    task = reverse.make_task(config)
    module = PredictorModule.from_task(task, config.train)
    digits = torch.randint(10, (256, 16), generator=torch.Generator().manual_seed(7))
    val_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(reverse.one_hot(digits, 10), digits.flip(1)), batch_size=128)
    trainer = lightning.Trainer(max_epochs=config.train.epochs, accelerator="cpu", logger=False,
                                gradient_clip_val=config.train.grad_clip,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False)
    seed_everything(config.train.seed)
    trainer.fit(module, task_loader(task, seed=config.train.seed), val_loader)

    assert trainer.global_step == config.train.epochs * task.batches_per_epoch
    # The schedule is stepped per batch: at the end of the cosine decay the rate is ~0.
    assert trainer.optimizers[0].param_groups[0]["lr"] < 1e-5
    accuracy = task.evaluate(task.model, "val")["accuracy"]
    assert accuracy > 0.9
    # Same initial weights, batches, optimizer, schedule and clipping as attnlab's own loop.
    assert abs(accuracy - reference["val"]["accuracy"]) < 0.02
    logged = trainer.callback_metrics
    assert {"train_loss", "train_acc", "val_loss", "val_acc"} <= set(logged)
    assert abs(float(logged["val_acc"]) - accuracy) < 0.05  # a fresh draw of the same task

    maps = module.get_attention_maps(reverse.one_hot(digits[:2], 10))
    assert maps[0].shape == (2, 1, 16, 16)


def test_task_without_accuracy_is_refused():
    task = reverse.make_task(reverse.ReverseConfig(train_size=256, val_size=8, test_size=8))
    task.accuracy = None
    with pytest.raises(ValueError, match="no batch accuracy"):
        PredictorModule.from_task(task, TrainConfig())
