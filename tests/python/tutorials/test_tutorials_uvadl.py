"""attnlab.tutorials.uvadl: the UvA tutorial's code, written as the tutorial writes it (its masks,
its return tuples, its Lightning modules), against float64 references of its equations."""

import math
import sys
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torch.utils.data as data

import attnlab
from attnlab.tutorials.uvadl import (DATA_MEANS, DATA_STD, LIGHTNING, CosineWarmupScheduler,
                                     EncoderBlock, MultiheadAttention, PositionalEncoding,
                                     ReverseDataset, SetAnomalyDataset, TransformerEncoder,
                                     expand_mask, plot_attention_maps, scaled_dot_product,
                                     seed_42_example, visualize_exmp)

needs_lightning = pytest.mark.skipif(LIGHTNING is None, reason="Lightning is not installed "
                                     "(pip install lightning)")

TIGHT = dict(rtol=1e-5, atol=1e-5)


# ---- float64 references of the tutorial's equations ---------------------------------------------

def ref_attention(q, k, v, mask=None):
    """The tutorial's scaled_dot_product in float64: logits masked where mask == 0 with -9e15."""
    logits = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits.masked_fill(mask == 0, -9e15)
    attention = torch.softmax(logits, dim=-1)
    return attention @ v.double(), attention


def ref_mha(module, x, mask=None):
    B, L, _ = x.shape
    H, hd = module.num_heads, module.head_dim
    qkv = x.double() @ module.qkv_proj.weight.double().T + module.qkv_proj.bias.double()
    q, k, v = qkv.reshape(B, L, H, 3 * hd).permute(0, 2, 1, 3).chunk(3, dim=-1)
    if mask is not None:
        mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
    values, attention = ref_attention(q, k, v, mask)
    values = values.permute(0, 2, 1, 3).reshape(B, L, H * hd)
    return values @ module.o_proj.weight.double().T + module.o_proj.bias.double(), attention


def ref_layer_norm(norm, x):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def ref_linear(linear, x):
    return x @ linear.weight.double().T + linear.bias.double()


def ref_block(block, x, mask=None):
    x = ref_layer_norm(block.norm1, x + ref_mha(block.self_attn, x, mask)[0])
    hidden = torch.relu(ref_linear(block.linear_net[0], x))
    return ref_layer_norm(block.norm2, x + ref_linear(block.linear_net[3], hidden))


def ref_positional_table(length, d):
    position = torch.arange(length, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)
    angle = position / 10000 ** (i / d)
    table = torch.zeros(length, d, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return table


def ref_predictor(model, x, mask=None, add_positional_encoding=True):
    h = ref_linear(model.input_net[1], x.double())
    if add_positional_encoding:
        h = h + ref_positional_table(h.shape[1], h.shape[2])
    maps = []
    for block in model.transformer.layers:
        maps.append(ref_mha(block.self_attn, h, mask)[1])
        h = ref_block(block, h, mask)
    out = torch.relu(ref_layer_norm(model.output_net[1], ref_linear(model.output_net[0], h)))
    return ref_linear(model.output_net[4], out), maps


# ---- scaled_dot_product and its masks ------------------------------------------------------------

def test_seed_42_worked_example_gives_the_tutorials_values():
    seq_len, d_k = 3, 2
    torch.manual_seed(42)  # the tutorial: pl.seed_everything(42) / L.seed_everything(42)
    q = torch.randn(seq_len, d_k)
    k = torch.randn(seq_len, d_k)
    v = torch.randn(seq_len, d_k)
    values, attention = scaled_dot_product(q, k, v)

    expected_values, expected_attention = ref_attention(q, k, v)
    torch.testing.assert_close(values.double(), expected_values, **TIGHT)
    torch.testing.assert_close(attention.double(), expected_attention, **TIGHT)
    # The numbers the tutorial prints (4 decimals).
    printed_q = torch.tensor([[0.3367, 0.1288], [0.2345, 0.2303], [-1.1229, -0.1863]])
    printed_values = torch.tensor([[0.5698, -0.1520], [0.5379, -0.0265], [0.2246, 0.5556]])
    printed_attention = torch.tensor([[0.4028, 0.2886, 0.3086], [0.3538, 0.3069, 0.3393],
                                      [0.1303, 0.4630, 0.4067]])
    torch.testing.assert_close(q, printed_q, rtol=0, atol=5e-5)
    torch.testing.assert_close(values, printed_values, rtol=0, atol=5e-5)
    torch.testing.assert_close(attention, printed_attention, rtol=0, atol=5e-5)

    # The demo gives the same without touching the global generator.
    state = torch.get_rng_state()
    demo = seed_42_example()
    assert torch.equal(torch.get_rng_state(), state)
    for name, tensor in (("q", q), ("k", k), ("v", v), ("values", values),
                         ("attention", attention)):
        torch.testing.assert_close(demo[name], tensor, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_tutorial_tril_mask_is_causal_in_every_dtype(dtype):
    torch.manual_seed(0)
    L = 6
    q, k, v = torch.randn(2, L, 8), torch.randn(2, L, 8), torch.randn(2, L, 5)
    mask = torch.tril(torch.ones(L, L)).to(dtype)  # the tutorial's causal mask: 0 = blocked
    values, attention = scaled_dot_product(q, k, v, mask=mask)

    expected_values, expected_attention = ref_attention(q, k, v, mask)
    torch.testing.assert_close(values.double(), expected_values, **TIGHT)
    torch.testing.assert_close(attention.double(), expected_attention, **TIGHT)
    assert bool((attention.triu(1) == 0).all())


def test_float_tril_mask_needs_the_adapter():
    """What the adapter is for: attnlab's core adds a float mask to the scores, so the UvA
    causal mask given to it unchanged masks nothing."""
    torch.manual_seed(1)
    L = 5
    q, k, v = torch.randn(L, 4), torch.randn(L, 4), torch.randn(L, 4)
    mask = torch.tril(torch.ones(L, L))
    _, core_weights = attnlab.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                           need_weights=True)
    _, tutorial_weights = scaled_dot_product(q, k, v, mask=mask)
    future = mask == 0
    assert bool((core_weights[future] > 0).all())       # future keys seen: not causal
    assert bool((tutorial_weights[future] == 0).all())  # causal


def test_fully_masked_query_gets_zeros_where_the_tutorial_gets_uniform_weights():
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]])  # query 1 may attend nowhere
    values, attention = scaled_dot_product(q, k, v, mask=mask)
    assert torch.equal(values[1], torch.zeros(4)) and torch.equal(attention[1], torch.zeros(3))
    _, tutorial_attention = ref_attention(q, k, v, mask)
    torch.testing.assert_close(tutorial_attention[1], torch.full((3,), 1 / 3, dtype=torch.float64))
    expected_values, expected_attention = ref_attention(q, k, v, mask)
    for row in (0, 2):  # the other rows as in the tutorial
        torch.testing.assert_close(attention[row].double(), expected_attention[row], **TIGHT)
        torch.testing.assert_close(values[row].double(), expected_values[row], **TIGHT)


def test_expand_mask_shapes():
    L = 4
    assert expand_mask(torch.ones(L, L)).shape == (1, 1, L, L)
    assert expand_mask(torch.ones(3, L, L)).shape == (3, 1, L, L)
    assert expand_mask(torch.ones(3, 2, L, L)).shape == (3, 2, L, L)
    with pytest.raises(ValueError, match="mask must have shape"):
        expand_mask(torch.ones(L))


# ---- the modules ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_shape", ["LL", "BLL", "BHLL"])
def test_multihead_attention_and_encoder_with_tutorial_masks(mask_shape):
    torch.manual_seed(3)
    B, L, d, H = 2, 7, 16, 4
    x = torch.randn(B, L, d)
    causal = torch.tril(torch.ones(L, L))
    mask = {"LL": causal, "BLL": causal.expand(B, L, L).clone(),
            "BHLL": causal.expand(B, H, L, L).clone()}[mask_shape]

    mha = MultiheadAttention(input_dim=d, embed_dim=d, num_heads=H)
    o, attention = mha(x, mask=mask, return_attention=True)
    expected_o, expected_attention = ref_mha(mha, x, mask)
    torch.testing.assert_close(o.double(), expected_o, **TIGHT)
    torch.testing.assert_close(attention.double(), expected_attention, **TIGHT)
    torch.testing.assert_close(mha(x, mask=mask), o, **TIGHT)  # without the weights

    encoder = TransformerEncoder(num_layers=2, input_dim=d, num_heads=H, dim_feedforward=2 * d,
                                 dropout=0.0)
    h = x.double()
    for block in encoder.layers:
        h = ref_block(block, h, mask)
    torch.testing.assert_close(encoder(x, mask=mask).double(), h, **TIGHT)
    with attnlab.interpret.record():  # the module-by-module path (the fused one is above)
        torch.testing.assert_close(encoder(x, mask=mask).double(), h, **TIGHT)
    # The block and the attention inside it read the tutorial's mask too.
    block = encoder.layers[0]
    assert isinstance(block, EncoderBlock) and isinstance(block.self_attn, MultiheadAttention)
    torch.testing.assert_close(block(x, mask=mask).double(), ref_block(block, x.double(), mask),
                               **TIGHT)
    _, attn_map = block.self_attn(x, mask=mask, return_attention=True)
    assert bool((attn_map.triu(1) == 0).all())


def test_positional_encoding_and_warmup_schedule():
    encod_block = PositionalEncoding(d_model=48, max_len=96)
    pe = encod_block.pe.squeeze().T.cpu().numpy()  # the tutorial's plot input
    assert pe.shape == (48, 96)
    torch.testing.assert_close(encod_block.pe[0].double(), ref_positional_table(96, 48),
                               rtol=0, atol=1e-6)

    p = torch.nn.Parameter(torch.empty(4, 4))
    optimizer = torch.optim.Adam([p], lr=1e-3)
    lr_scheduler = CosineWarmupScheduler(optimizer=optimizer, warmup=100, max_iters=2000)
    for epoch in (0, 1, 50, 100, 101, 1000, 1999):
        expected = 0.5 * (1 + math.cos(math.pi * epoch / 2000)) * min(1.0, epoch / 100)
        assert lr_scheduler.get_lr_factor(epoch) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_plot_attention_maps_grid_and_ticks():
    torch.manual_seed(4)
    data_input = torch.randint(10, (2, 5))
    attention_maps = [torch.softmax(torch.randn(2, 3, 5, 5), -1) for _ in range(2)]
    fig = plot_attention_maps(data_input, attention_maps, idx=1, show=False)
    image_axes = [ax for ax in fig.axes if ax.images]
    assert len(image_axes) == 2 * 3
    first = image_axes[0]
    assert [t.get_text() for t in first.get_xticklabels()] == [str(d) for d in
                                                               data_input[1].tolist()]
    np.testing.assert_allclose(first.images[0].get_array(), attention_maps[0][1, 0].numpy())
    assert plot_attention_maps(None, attention_maps, idx=0, show=True) is None  # not IPython

    images = torch.rand(30, 3, 8, 8)  # an image data set normalised as the tutorial's CIFAR
    mean, std = torch.tensor(DATA_MEANS).view(3, 1, 1), torch.tensor(DATA_STD).view(3, 1, 1)
    test_set = [(((image - mean) / std).float(), 0) for image in images]
    indices = torch.randint(30, (2, 10))
    fig = visualize_exmp(indices, test_set, show=False)
    assert len(fig.axes) == 20
    np.testing.assert_allclose(fig.axes[11].images[0].get_array(),
                               images[indices[1, 1]].permute(1, 2, 0).numpy(), atol=1e-6)


# ---- data sets -----------------------------------------------------------------------------------

def test_reverse_dataset_items():
    torch.manual_seed(5)
    dataset = partial(ReverseDataset, 10, 16)
    train_set = dataset(50)
    inp_data, labels = train_set[3]
    assert len(train_set) == 50 and inp_data.shape == (16,)
    assert torch.equal(labels, inp_data.flip(0))
    assert int(train_set.data.max()) < 10 and int(train_set.data.min()) >= 0


def _features(classes=5, per_class=12, dim=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return torch.randn(classes * per_class, dim, generator=generator), labels


def test_set_anomaly_dataset_sets():
    feats, labels = _features()
    state = np.random.get_state()[1].copy()
    test_anom_dataset = SetAnomalyDataset(feats, labels, set_size=10, train=False)
    assert np.array_equal(np.random.get_state()[1], state)  # the fixed sets use their own seed
    again = SetAnomalyDataset(feats, labels, set_size=10, train=False)
    assert torch.equal(test_anom_dataset.test_sets, again.test_sets)

    for idx in range(len(feats)):
        img_set, indices, label = test_anom_dataset[idx]
        assert img_set.shape == (10, 6) and label == 9 and int(indices[-1]) == idx
        assert torch.equal(img_set, feats[indices])
        normal = labels[indices[:-1]]
        assert bool((normal == normal[0]).all()) and int(normal[0]) != int(labels[idx])
        assert len(set(indices[:-1].tolist())) == 9

    train_anom_dataset = SetAnomalyDataset(feats, labels, set_size=10, train=True)
    np.random.seed(0)
    first = train_anom_dataset[0][1]
    assert not all(torch.equal(first, train_anom_dataset[0][1]) for _ in range(5))  # redrawn


def test_set_anomaly_dataset_sorts_labels_as_the_tutorial():
    """Images of one class are listed in torch's default sort order of the labels (the
    tutorial's), not a stable sort: at Fashion-MNIST's 10,000 shuffled test labels the two orders
    differ, and with them the fixed test sets."""
    labels = torch.randperm(10_000, generator=torch.Generator().manual_seed(0)) % 10
    assert not torch.equal(torch.argsort(labels), torch.argsort(labels, stable=True))
    dataset = SetAnomalyDataset(torch.zeros(10_000, 1), labels, set_size=10, train=True)
    assert torch.equal(dataset.img_idx_by_label.flatten(), torch.argsort(labels))


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="same number of images"):
        SetAnomalyDataset(torch.randn(7, 3), torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    with pytest.raises(ValueError, match="fewer than"):
        SetAnomalyDataset(*_features(per_class=4), set_size=10)
    with pytest.raises(ValueError, match="num_categories"):
        ReverseDataset(0, 16, 10)
    with pytest.raises(TypeError, match="mask must be real"):
        scaled_dot_product(torch.randn(3, 2), torch.randn(3, 2), torch.randn(3, 2),
                           mask=torch.ones(3, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="mask must have shape"):
        MultiheadAttention(8, 8, 2)(torch.randn(2, 5, 8), mask=torch.ones(4, 4))


def test_lightning_package_choice(monkeypatch):
    from attnlab.tutorials import uvadl
    monkeypatch.setenv("ATTNLAB_LIGHTNING", "keras")
    with pytest.raises(ImportError, match="ATTNLAB_LIGHTNING must be"):
        uvadl._choose_lightning()
    if LIGHTNING is not None:
        monkeypatch.setenv("ATTNLAB_LIGHTNING", LIGHTNING.__name__)
        assert uvadl._choose_lightning() is LIGHTNING
        from attnlab.tutorials.uvadl import TransformerPredictor
        assert issubclass(TransformerPredictor, LIGHTNING.LightningModule)


# ---- the Lightning modules -----------------------------------------------------------------------

TUTORIAL_KEYS = [  # the state dict of the tutorial's TransformerPredictor with one layer
    "input_net.1.weight", "input_net.1.bias",
    "transformer.layers.0.self_attn.qkv_proj.weight",
    "transformer.layers.0.self_attn.qkv_proj.bias",
    "transformer.layers.0.self_attn.o_proj.weight", "transformer.layers.0.self_attn.o_proj.bias",
    "transformer.layers.0.linear_net.0.weight", "transformer.layers.0.linear_net.0.bias",
    "transformer.layers.0.linear_net.3.weight", "transformer.layers.0.linear_net.3.bias",
    "transformer.layers.0.norm1.weight", "transformer.layers.0.norm1.bias",
    "transformer.layers.0.norm2.weight", "transformer.layers.0.norm2.bias",
    "output_net.0.weight", "output_net.0.bias", "output_net.1.weight", "output_net.1.bias",
    "output_net.4.weight", "output_net.4.bias"]


@needs_lightning
def test_transformer_predictor_forward_and_maps_match_the_tutorial():
    from attnlab.tutorials.uvadl import ReversePredictor, TransformerPredictor
    torch.manual_seed(6)
    model = ReversePredictor(input_dim=10, model_dim=32, num_classes=10, num_heads=2,
                             num_layers=2, lr=5e-4, warmup=50, max_iters=100)
    model.eval()
    inp_data = F.one_hot(torch.randint(10, (3, 16)), num_classes=10).float()
    mask = torch.tril(torch.ones(16, 16))
    for kwargs in ({}, {"mask": mask}, {"add_positional_encoding": False}):
        preds = model(inp_data, **kwargs)
        attention_maps = model.get_attention_maps(inp_data, **kwargs)
        expected, expected_maps = ref_predictor(model, inp_data, kwargs.get("mask"),
                                                kwargs.get("add_positional_encoding", True))
        torch.testing.assert_close(preds.double(), expected, **TIGHT)
        assert len(attention_maps) == 2 and attention_maps[0].shape == (3, 2, 16, 16)
        for ours, reference in zip(attention_maps, expected_maps):
            torch.testing.assert_close(ours.double(), reference, **TIGHT)

    one_layer = TransformerPredictor(10, 32, 10, 1, 1, lr=5e-4, warmup=50, max_iters=100)
    assert list(one_layer.state_dict()) == TUTORIAL_KEYS  # the tutorial's checkpoints load
    copy = TransformerPredictor(10, 32, 10, 1, 1, lr=5e-4, warmup=50, max_iters=100)
    copy.load_state_dict(one_layer.state_dict())
    torch.testing.assert_close(copy.eval()(inp_data), one_layer.eval()(inp_data))
    with pytest.raises(ValueError, match="lr must be a positive number"):
        TransformerPredictor(10, 32, 10, 1, 1, lr=0, warmup=50, max_iters=100)


@needs_lightning
def test_train_reverse_as_the_tutorial_calls_it(tmp_path, monkeypatch):
    from attnlab.tutorials.uvadl import train_reverse
    torch.manual_seed(7)
    # The tutorial's notebook globals, read by train_reverse as the tutorial's function does.
    dataset = partial(ReverseDataset, 10, 16)
    train_loader = data.DataLoader(dataset(2560), batch_size=128, shuffle=True, drop_last=True)
    val_loader = data.DataLoader(dataset(256), batch_size=128)
    test_loader = data.DataLoader(dataset(256), batch_size=128)
    notebook = sys.modules["__main__"]
    for name, value in (("train_loader", train_loader), ("val_loader", val_loader),
                        ("test_loader", test_loader), ("CHECKPOINT_PATH", str(tmp_path))):
        monkeypatch.setattr(notebook, name, value, raising=False)

    reverse_model, reverse_result = train_reverse(
        input_dim=train_loader.dataset.num_categories, model_dim=32, num_heads=1,
        num_classes=train_loader.dataset.num_categories, num_layers=1, dropout=0.0, lr=5e-3,
        warmup=20, trainer_args={"enable_progress_bar": False, "enable_model_summary": False,
                                 "logger": False, "accelerator": "cpu"})

    assert set(reverse_result) == {"val_acc", "test_acc"}
    assert reverse_result["val_acc"] > 0.9 and reverse_result["test_acc"] > 0.9
    # The cosine warm-up schedule was stepped once per batch: 10 epochs × 20 batches.
    assert reverse_model.hparams.max_iters == 200
    assert reverse_model.lr_scheduler.last_epoch == 200
    assert list((tmp_path / "ReverseTask").rglob("*.ckpt"))  # the best checkpoint was kept

    # The tutorial's look at the map: position i attends to position 15 - i.
    data_input, labels = next(iter(val_loader))
    inp_data = F.one_hot(data_input, num_classes=reverse_model.hparams.num_classes).float()
    reverse_model.eval()
    attention_maps = reverse_model.get_attention_maps(inp_data)
    assert attention_maps[0].shape == (128, 1, 16, 16)
    looked_at = attention_maps[0][:, 0].argmax(-1)
    assert (looked_at == torch.arange(15, -1, -1)).float().mean() > 0.9
    with torch.no_grad():
        preds = reverse_model(inp_data)
    assert (preds.argmax(-1) == labels).float().mean() > 0.9


@needs_lightning
def test_anomaly_predictor_loss_and_permutation_equivariance(tmp_path):
    from attnlab.tutorials.uvadl import AnomalyPredictor, train_anomaly
    torch.manual_seed(8)
    feats, labels = _features(classes=4, per_class=12, dim=8)
    train_anom_dataset = SetAnomalyDataset(feats, labels, set_size=10, train=True)
    test_anom_dataset = SetAnomalyDataset(feats, labels, set_size=10, train=False)
    train_anom_loader = data.DataLoader(train_anom_dataset, batch_size=16, shuffle=True,
                                        drop_last=True)
    test_anom_loader = data.DataLoader(test_anom_dataset, batch_size=16)
    anomaly_model, anomaly_result = train_anomaly(
        train_anom_loader, test_anom_loader, test_anom_loader, checkpoint_path=str(tmp_path),
        max_epochs=2, input_dim=train_anom_dataset.img_feats.shape[-1], model_dim=16,
        num_heads=2, num_classes=1, num_layers=1, dropout=0.1, input_dropout=0.1, lr=5e-4,
        warmup=4, trainer_args={"enable_progress_bar": False, "enable_model_summary": False,
                                "logger": False, "accelerator": "cpu"})
    assert isinstance(anomaly_model, AnomalyPredictor)  # reloaded from the best checkpoint
    assert set(anomaly_result) == {"train_acc", "val_acc", "test_acc"}

    inp_data, indices, batch_labels = next(iter(test_anom_loader))
    anomaly_model.eval()
    with torch.no_grad():
        preds = F.softmax(anomaly_model.forward(inp_data, add_positional_encoding=False)
                          .squeeze(dim=-1), dim=-1)
        permut = np.random.permutation(inp_data.shape[1])
        perm_preds = F.softmax(anomaly_model.forward(inp_data[:, permut],
                                                     add_positional_encoding=False)
                               .squeeze(dim=-1), dim=-1)
    assert (preds[:, permut] - perm_preds).abs().max() < 1e-5
    fresh = AnomalyPredictor(**anomaly_model.hparams)  # not attached to a Trainer
    fresh.load_state_dict(anomaly_model.state_dict())
    fresh.eval()
    with pytest.warns(UserWarning, match="self.log"):  # logging needs a Trainer: only a warning
        loss, acc = fresh._calculate_loss((inp_data, indices, batch_labels), mode="test")
    logits, _ = ref_predictor(fresh, inp_data, add_positional_encoding=False)
    expected = F.cross_entropy(logits.squeeze(-1), batch_labels)
    torch.testing.assert_close(loss.double(), expected, **TIGHT)
    assert acc == (logits.squeeze(-1).argmax(-1) == batch_labels).double().mean().item()
