"""attnlab.tutorials.nyu: the NYU self-attention notebook's code, written as the notebook writes
it (its key–value demo with its tensors, its (H, A) pairs, its classifier and loops), against
float64 references of its equations."""

import math
import sys

import pytest
import torch

from attnlab.tutorials.nyu import (CNN, Embeddings, EncoderLayer, MultiHeadAttention,
                                   TransformerClassifier, create_sinusoidal_embeddings, evaluate,
                                   key_value_demo, train)

TIGHT = dict(rtol=1e-5, atol=1e-5)


def ref_sdpa(Q, K, V, d_k):
    A = torch.softmax(Q.double() @ K.double().transpose(-2, -1) / math.sqrt(d_k), dim=-1)
    return A @ V.double(), A


def ref_mha(mha, X_q, X_k, X_v):
    B, H, d_k = X_q.shape[0], mha.num_heads, mha.d_k

    def heads(x, W):
        return (x.double() @ W.weight.double().T).reshape(B, -1, H, d_k).transpose(1, 2)

    H_cat, A = ref_sdpa(heads(X_q, mha.W_q), heads(X_k, mha.W_k), heads(X_v, mha.W_v), d_k)
    H_cat = H_cat.transpose(1, 2).reshape(B, -1, H * d_k)
    return H_cat @ mha.W_h.weight.double().T + mha.W_h.bias.double(), A


def ref_layer_norm(norm, x):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()


def ref_sinusoids(nb_p, dim):
    """The notebook's table: theta[p, j] = p / 10000^(2·(j // 2) / dim); sin on even columns,
    cos on odd ones."""
    p = torch.arange(nb_p, dtype=torch.float64)[:, None]
    j = torch.arange(dim, dtype=torch.float64)
    theta = p / torch.pow(10000.0, 2 * torch.div(j, 2, rounding_mode="floor") / dim)
    table = torch.empty(nb_p, dim, dtype=torch.float64)
    table[:, 0::2], table[:, 1::2] = torch.sin(theta[:, 0::2]), torch.cos(theta[:, 1::2])
    return table


def ref_classifier(model, ids):
    embedding = model.encoder.embedding
    d_model = model.dense.in_features
    x = embedding.word_embeddings.weight.double()[ids] + ref_sinusoids(ids.shape[1], d_model)
    x = ref_layer_norm(embedding.LayerNorm, x)
    for layer in model.encoder.enc_layers:
        out1 = ref_layer_norm(layer.layernorm1, x + ref_mha(layer.mha, x, x, x)[0])
        hidden = torch.relu(out1 @ layer.cnn.k1convL1.weight.double().T
                            + layer.cnn.k1convL1.bias.double())
        cnn = hidden @ layer.cnn.k1convL2.weight.double().T + layer.cnn.k1convL2.bias.double()
        x = ref_layer_norm(layer.layernorm2, out1 + cnn)
    pooled = x.max(dim=1).values
    return pooled @ model.dense.weight.double().T + model.dense.bias.double()


def test_key_value_lookup_with_the_notebooks_tensors(capsys):
    temp_mha = MultiHeadAttention(d_model=512, num_heads=8, p=0)

    def print_out(Q, K, V):  # the notebook's helper, as it writes it
        temp_out, temp_attn = temp_mha.scaled_dot_product_attention(Q, K, V)
        print("Attention weights are:", temp_attn.squeeze())
        print("Output is:", temp_out.squeeze())
        return temp_out, temp_attn

    test_K = torch.tensor([[10, 0, 0], [0, 10, 0], [0, 0, 10], [0, 0, 10]]).float()[None, None]
    test_V = torch.tensor([[1, 0, 0], [10, 0, 0], [100, 5, 0], [1000, 6, 0]]).float()[None, None]

    test_Q = torch.tensor([[0, 10, 0]]).float()[None, None]  # matches the second key
    out, attn = print_out(test_Q, test_K, test_V)
    assert "Output is:" in capsys.readouterr().out
    expected_out, expected_attn = ref_sdpa(test_Q, test_K, test_V, d_k=64)  # scale 1/8
    torch.testing.assert_close(out.double(), expected_out, **TIGHT)
    torch.testing.assert_close(attn.double(), expected_attn, **TIGHT)
    torch.testing.assert_close(out[0, 0, 0], test_V[0, 0, 1], rtol=0, atol=1e-2)
    assert attn[0, 0, 0, 1] > 0.9999

    test_Q = torch.tensor([[0, 0, 10]]).float()[None, None]  # matches the last two equally
    out, attn = print_out(test_Q, test_K, test_V)
    torch.testing.assert_close(out[0, 0, 0], test_V[0, 0, 2:].mean(0), rtol=0, atol=1e-2)
    torch.testing.assert_close(attn[0, 0, 0, 2:], torch.tensor([0.5, 0.5]), rtol=0, atol=1e-5)

    test_Q = torch.tensor([[0, 0, 10], [0, 10, 0], [10, 10, 0]]).float()[None, None]
    out, attn = print_out(test_Q, test_K, test_V)
    assert out.shape == (1, 1, 3, 3) and attn.shape == (1, 1, 3, 4)
    expected_out, expected_attn = ref_sdpa(test_Q, test_K, test_V, d_k=64)
    torch.testing.assert_close(out.double(), expected_out, **TIGHT)
    torch.testing.assert_close(attn.double(), expected_attn, **TIGHT)
    torch.testing.assert_close(out[0, 0, 2], test_V[0, 0, :2].mean(0), rtol=0, atol=1e-2)

    demo = key_value_demo()  # the same lookups, packaged
    torch.testing.assert_close(demo["three"][1], out, rtol=0, atol=0)
    torch.testing.assert_close(demo["one_key"][1][0, 0, 0], test_V[0, 0, 1], rtol=0, atol=1e-2)


def test_multi_head_attention_cross_widths_and_heads():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=12, num_heads=3, p=0.1, d_input=5)
    X_q, X_k = torch.randn(2, 4, 5), torch.randn(2, 6, 5)
    H, A = mha(X_q, X_k, X_k)
    expected_H, expected_A = ref_mha(mha, X_q, X_k, X_k)
    assert H.shape == (2, 4, 12) and A.shape == (2, 3, 4, 6)
    torch.testing.assert_close(H.double(), expected_H, **TIGHT)
    torch.testing.assert_close(A.double(), expected_A, **TIGHT)
    x = torch.randn(2, 4, 12)
    assert torch.equal(mha.group_heads(mha.split_heads(x, 2), 2), x)
    assert mha.split_heads(x, 2).shape == (2, 3, 4, 4)

    class SigmoidAttention(MultiHeadAttention):  # a variant overriding the notebook's method
        def scaled_dot_product_attention(self, Q, K, V):
            A = torch.sigmoid(Q @ K.transpose(2, 3) / math.sqrt(self.d_k))
            return A @ V, A

    variant = SigmoidAttention(12, 3, 0.0, d_input=5)
    variant.load_state_dict(mha.state_dict())
    _, A = variant(X_q, X_k, X_k)
    assert not torch.allclose(A.sum(-1), torch.ones(2, 3, 4))  # forward used the override


def test_transformer_classifier_matches_the_notebooks_equations():
    torch.manual_seed(1)
    model = TransformerClassifier(num_layers=2, d_model=16, num_heads=2, conv_hidden_dim=32,
                                  input_vocab_size=40, num_answers=2)
    ids = torch.randint(2, 40, (3, 9))
    torch.testing.assert_close(model(ids).double(), ref_classifier(model, ids), **TIGHT)

    table = model.encoder.embedding.position_embeddings.weight
    assert table.shape == (10000, 16) and not table.requires_grad  # frozen, as in the notebook
    torch.testing.assert_close(table[:50].double(), ref_sinusoids(50, 16), rtol=0, atol=1e-6)
    E = torch.nn.Embedding(30, 6).weight
    assert create_sinusoidal_embeddings(nb_p=30, dim=6, E=E) is E and not E.requires_grad
    torch.testing.assert_close(E.double(), ref_sinusoids(30, 6), rtol=0, atol=1e-6)

    layer = EncoderLayer(16, 2, 32)
    assert isinstance(layer.mha, MultiHeadAttention) and isinstance(layer.cnn, CNN)
    assert layer.layernorm1.eps == 1e-6
    assert Embeddings(16, 40, 100, 0.1).LayerNorm.eps == 1e-12


def _toy_corpus(n, generator):
    """Sentences of 12 tokens; label 1 iff the token 5 occurs."""
    ids = torch.randint(6, 30, (n, 12), generator=generator)
    labels = torch.randint(0, 2, (n,), generator=generator)
    where = torch.randint(0, 12, (n,), generator=generator)
    positive = labels == 1
    ids[positive.nonzero()[:, 0], where[positive]] = 5
    return torch.utils.data.TensorDataset(ids, labels)


def test_train_and_evaluate_as_the_notebook_calls_them(monkeypatch, capsys):
    generator = torch.Generator().manual_seed(2)
    train_loader = torch.utils.data.DataLoader(_toy_corpus(512, generator), batch_size=32,
                                               shuffle=True)
    valid_loader = torch.utils.data.DataLoader(_toy_corpus(256, generator), batch_size=64)
    torch.manual_seed(2)
    model = TransformerClassifier(num_layers=1, d_model=16, num_heads=2, conv_hidden_dim=32,
                                  input_vocab_size=30, num_answers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    frozen = model.encoder.embedding.position_embeddings.weight.clone()
    # The notebook's train/evaluate read its globals `model` and `optimizer`.
    monkeypatch.setattr(sys.modules["__main__"], "model", model, raising=False)
    monkeypatch.setattr(sys.modules["__main__"], "optimizer", optimizer, raising=False)

    history = train(train_loader, valid_loader, epochs=3)
    assert "Eval accuracy" in capsys.readouterr().out
    assert history[-1]["valid_acc"] > 0.95 and history[-1]["train_loss"] < history[0]["train_loss"]
    assert torch.equal(model.encoder.embedding.position_embeddings.weight, frozen)
    accuracy = evaluate(valid_loader)
    ids, labels = valid_loader.dataset.tensors
    with torch.no_grad():
        direct = (model(ids).argmax(1) == labels).float().mean().item()
    assert abs(accuracy - direct) < 1e-6  # equal batches: the batch mean is the mean


def test_train_reads_the_notebooks_epochs(monkeypatch, capsys):
    """As in the notebook, train's loop runs the global ``epochs`` unless given; with neither,
    a clear error names it."""
    generator = torch.Generator().manual_seed(3)
    loader = torch.utils.data.DataLoader(_toy_corpus(64, generator), batch_size=32)
    model = TransformerClassifier(num_layers=1, d_model=8, num_heads=2, conv_hidden_dim=8,
                                  input_vocab_size=30, num_answers=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "epochs", 2, raising=False)
    assert len(train(loader, loader, model, optimizer)) == 2
    assert len(train(loader, loader, model, optimizer, epochs=1)) == 1
    monkeypatch.delattr(main, "epochs")
    with pytest.raises(ValueError, match="pass epochs="):
        train(loader, loader, model, optimizer)
    capsys.readouterr()


def test_bad_inputs_are_named(monkeypatch):
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3, 0.0)
    mha = MultiHeadAttention(8, 2, 0.0)
    with pytest.raises(ValueError, match="batch_size"):
        mha.split_heads(torch.randn(2, 3, 8), 3)
    with pytest.raises(ValueError, match="X_k must have shape"):
        mha(torch.randn(2, 3, 8), torch.randn(2, 3, 7), torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="int64"):
        Embeddings(8, 20, 50)(torch.rand(2, 5))
    with pytest.raises(ValueError, match="shape"):
        create_sinusoidal_embeddings(10, 4, torch.empty(10, 5))
    monkeypatch.delattr(sys.modules["__main__"], "model", raising=False)
    with pytest.raises(ValueError, match="pass model="):
        evaluate([])
