"""Text classification (the NYU self-attention notebook): the aclImdb reader, the tokenizer, the classifier, and a
run on a small corpus the test writes."""

import dataclasses
import functools
import json

import pytest
import torch

from attnlab.data import DataError, load_imdb
from attnlab.nn import sinusoidal_table
from attnlab.tasks import text
from attnlab.train import TrainConfig, fit

from cli_runner import run_cli
from interruption import interrupt_during

run_cli_one_thread = functools.partial(run_cli, one_thread=True)


def write_reviews(folder, reviews):
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in reviews.items():
        (folder / name).write_text(content)


@pytest.fixture(scope="module")
def demo_corpus(tmp_path_factory):
    return text.write_demo_corpus(tmp_path_factory.mktemp("corpus") / "aclImdb",
                                  reviews_per_label=100)


def small_config(data, epochs=4, seed=0):
    return text.TextConfig(data=str(data), max_len=64, batch_size=16,
                           train=TrainConfig(epochs=epochs, lr=1e-2, warmup=10, seed=seed,
                                             optimizer="adamw"))


def test_tokenizer_lower_cases_and_drops_markup_and_punctuation():
    assert text.tokenize("A GREAT film!<br /><br />I didn't like the 2nd half...") == \
        ["a", "great", "film", "i", "didn't", "like", "the", "2nd", "half"]
    assert text.tokenize("  ,;  ") == []


def test_vocabulary_keeps_the_most_frequent_words_after_the_specials():
    tokenized = [["b", "a", "c", "b"], ["c", "b", "d", "a"], ["e"]]
    vocabulary = text.Vocabulary.build(tokenized, size=3)
    # b ×3; a and c ×2 each (alphabetical tie); d, e ×1 do not fit.
    assert vocabulary.words == ["<unk>", "<pad>", "b", "a", "c"]
    ids = vocabulary.encode([["a", "z", "b"], [], ["c"] * 6], length=4)
    assert ids.tolist() == [[3, 0, 2, 1], [0, 1, 1, 1], [4, 4, 4, 4]]
    assert vocabulary.decode(ids[0]) == ["a", "<unk>", "b", "<pad>"]
    with pytest.raises(ValueError, match="size \\(the vocabulary size\\) must be at least 1"):
        text.Vocabulary.build(tokenized, size=0)


def test_load_imdb_reads_the_layout_with_labels(tmp_path):
    for split in ("train", "test"):
        write_reviews(tmp_path / split / "pos", {"0_9.txt": f"{split} good", "1_8.txt": "fine"})
        write_reviews(tmp_path / split / "neg", {"0_2.txt": f"{split} bad"})
    (tmp_path / "train" / "unsup").mkdir()  # the real corpus has it; it is not read
    corpus = load_imdb(tmp_path)
    assert corpus["train"][0] == ["train bad", "train good", "fine"]
    assert corpus["train"][1].tolist() == [0, 1, 1]
    assert corpus["test"][0][0] == "test bad"


def test_load_imdb_errors_name_what_is_missing(tmp_path):
    with pytest.raises(DataError, match="needs the IMDB corpus: download aclImdb_v1.tar.gz"):
        load_imdb(None)
    with pytest.raises(DataError, match="nowhere is not a folder"):
        load_imdb(tmp_path / "nowhere")
    write_reviews(tmp_path / "train" / "pos", {"0_9.txt": "good"})
    with pytest.raises(DataError, match="is not an aclImdb folder: it lacks the sub-folder\\(s\\) "
                       "train/neg, test/neg, test/pos"):
        load_imdb(tmp_path)
    for folder in ("train/neg", "test/pos", "test/neg"):
        (tmp_path / folder).mkdir(parents=True)
    with pytest.raises(DataError, match="train/neg holds no .txt reviews"):
        load_imdb(tmp_path)


def test_classifier_shapes_and_padding_changes_nothing():
    torch.manual_seed(0)
    model = text.TextClassifier(vocab_size=20, d_model=8, num_heads=2, ff_dim=16,
                                max_positions=50).eval()
    ids = torch.tensor([[5, 6, 7, 8], [9, 3, 1, 1]])
    logits = model(ids)
    assert logits.shape == (2, 2)
    padded = torch.cat([ids, torch.ones(2, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded), logits)
    maps = model.get_attention_maps(ids)
    assert len(maps) == 1 and maps[0].shape == (2, 2, 4, 4)
    assert (maps[0][1, :, :, 2:] == 0).all(), "a padding position was attended to"
    assert model.position_embedding.weight.requires_grad
    with pytest.raises(ValueError, match="exceed the 50 positions"):
        model(torch.zeros(1, 51, dtype=torch.long))
    with pytest.raises(ValueError, match="ids must be an int64 tensor"):
        model(torch.zeros(1, 4))


def test_learns_the_separable_corpus(demo_corpus, one_thread):
    config = small_config(demo_corpus)
    task = text.make_task(config)
    result = fit(task, config.train, progress=False)
    assert result["test"]["accuracy"] >= 0.95, result
    maps, tokens = text.attention_example(task)
    assert maps[0].shape[-1] == len(tokens) and "<pad>" not in tokens


def test_interrupted_run_resumes_to_the_same_metrics(demo_corpus, tmp_path, one_thread):
    config = small_config(demo_corpus, epochs=2, seed=3)
    uninterrupted = fit(text.make_task(config), config.train, out_dir=tmp_path / "a",
                        progress=False)
    task = interrupt_during(text.make_task(config), epoch=1, batch=1)
    with pytest.raises(KeyboardInterrupt):
        fit(task, config.train, out_dir=tmp_path / "b", progress=False)
    resumed = fit(text.make_task(config), config.train, out_dir=tmp_path / "b", progress=False)
    assert resumed["history"] == uninterrupted["history"]
    assert resumed["test"] == uninterrupted["test"]


def test_config_validation():
    with pytest.raises(ValueError, match="val_fraction must be between 0 and 1, got 1.5"):
        text.TextConfig(val_fraction=1.5)
    with pytest.raises(ValueError,
                       match="max_len \\(300\\) must not exceed max_positions \\(200\\)"):
        text.TextConfig(max_len=300, max_positions=200)
    with pytest.raises(ValueError, match="optimizer must be one of adam, adamw, got 'sgd'"):
        TrainConfig(optimizer="sgd")
    assert dataclasses.asdict(text.default_config())["train"]["optimizer"] == "adamw"


def test_cli_without_data_explains_where_to_put_the_corpus():
    result = run_cli_one_thread("text", "--quiet")
    assert result.returncode == 1
    assert "attnlab text: error: the text experiment needs the IMDB corpus" in result.stderr
    assert "--data" in result.stderr and "cannot be downloaded from here" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_cli_folder_that_is_not_aclimdb_is_refused(tmp_path):
    result = run_cli_one_thread("text", "--quiet", "--data", str(tmp_path))
    assert result.returncode == 1 and "is not an aclImdb folder" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_fast_run_on_the_demo_corpus(demo_corpus, tmp_path):
    result = run_cli_one_thread("text", "--fast", "--quiet", "--data", str(demo_corpus), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["config"]["data"] == str(demo_corpus) and len(summary["history"]) == 2
    for name in ("attention.png", "training.png", "checkpoint.pt"):
        assert (tmp_path / name).stat().st_size > 0


# ---- the NYU notebook's own recipe ----

def test_nyu_recipe_settings():
    config = text.TextConfig(recipe="nyu")
    assert config.dropout == 0.0
    assert config.train.schedule == "constant" and config.train.grad_clip is None
    assert config.train.optimizer == "adamw" and config.train.lr == 1e-3
    assert text.default_config(recipe="nyu").recipe == "nyu"
    improved = text.TextConfig()
    assert improved.dropout == 0.1 and improved.train.schedule == "cosine"
    with pytest.raises(ValueError, match="recipe must be one of improved, nyu, got 'uva'"):
        text.TextConfig(recipe="uva")
    with pytest.raises(ValueError, match="schedule must be one of cosine, constant"):
        TrainConfig(schedule="linear")


def test_nyu_model_attends_to_and_pools_over_padding_with_frozen_sinusoids():
    torch.manual_seed(0)
    model = text.TextClassifier(vocab_size=20, d_model=8, num_heads=2, ff_dim=16,
                                max_positions=50, dropout=0.0, freeze_positions=True,
                                mask_padding=False).eval()
    assert not model.position_embedding.weight.requires_grad
    torch.testing.assert_close(model.position_embedding.weight, sinusoidal_table(50, 8))
    ids = torch.tensor([[5, 6, 7, 8], [9, 3, 1, 1]])
    maps = model.get_attention_maps(ids)
    assert (maps[0][1, :, :, 2:] > 0).all(), "no padding mask: padding is attended to"
    padded = torch.cat([ids, torch.ones(2, 3, dtype=torch.long)], 1)
    assert not torch.allclose(model(padded)[1], model(ids)[1])  # more padding, other output
    # The max-pool runs over every position, padding included (computed here from the layers).
    x = model.embedding_norm(model.token_embedding(ids) + model.position_embedding.weight[:4])
    for layer in model.layers:
        x, _ = layer(x, None)
    torch.testing.assert_close(model(ids), model.classifier(x.amax(1)))


def test_bucketed_batches_cover_every_row_once_sorted_within_batches():
    lengths = torch.randint(1, 200, (1000,), generator=torch.Generator().manual_seed(0))
    batches = text.bucketed_batches(lengths, 16, torch.Generator().manual_seed(1), pool_batches=5)
    rows = torch.cat(batches)
    assert sorted(rows.tolist()) == list(range(1000))
    assert all(len(b) == 16 for b in batches[:-1] if len(b) != 1000 % 16)
    assert all(bool((lengths[b].diff() >= 0).all()) for b in batches)  # one pool's sorted run
    spread = torch.stack([lengths[b].float().std() for b in batches if len(b) > 1]).mean()
    assert spread < lengths.float().std() / 3  # similar lengths share a batch
    again = text.bucketed_batches(lengths, 16, torch.Generator().manual_seed(1), pool_batches=5)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))


def test_nyu_recipe_learns_the_demo_corpus_and_keeps_its_positions(demo_corpus, tmp_path,
                                                                   one_thread):
    config = dataclasses.replace(small_config(demo_corpus), recipe="nyu")
    task = text.make_task(config)
    before = task.model.position_embedding.weight.clone()
    result = fit(task, config.train, out_dir=tmp_path, progress=False)
    assert result["test"]["accuracy"] >= 0.9, result
    assert torch.equal(task.model.position_embedding.weight, before)
    assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in task.model.modules())
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert state["scheduler"]["_last_lr"] == [config.train.lr]  # constant to the end


def test_cli_nyu_recipe(demo_corpus, tmp_path):
    result = run_cli_one_thread("text", "--fast", "--epochs", "1", "--recipe", "nyu", "--quiet",
                                "--data", str(demo_corpus), "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["config"]["recipe"] == "nyu" and summary["config"]["dropout"] == 0.0
    assert summary["config"]["train"]["schedule"] == "constant"
