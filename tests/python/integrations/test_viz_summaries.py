"""attnlab.viz.summary_view on the Python side, and the exact block weights it embeds
(attnlab.interpret.Summaries.block_weights): the page's data read back without the code under
test and compared with the summaries and with the full weights; its input checks; its size at
16,384 tokens. What the page does in a browser: test_viz_summaries_browser.py."""

import base64
import hashlib
import json
import math
import re
import zlib
from importlib import resources

import numpy as np
import pytest
import torch

import attnlab
from attnlab import WeightSummary, viz
from attnlab.interpret import summarize

POOL, TOPK = 32, 5


def attention_inputs(batch=2, heads=4, kv_heads=2, length=300, dim=16, seed=0,
                     dtype=torch.float32):
    """Query, key and value of one layer, key 0 made an attention sink: every query shares a
    direction with it, so that the summaries have something to show."""
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, length, dim, generator=generator, dtype=dtype) + 1
    key = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=dtype)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator, dtype=dtype)
    key[:, :, 0] = 3.0
    return query, key, value


def record(layers=3, keep_inputs=True, **options):
    summary = WeightSummary(received=True, entropy=True, topk=TOPK, pool=POOL)
    calls = [attention_inputs(seed=layer, **options) for layer in range(layers)]
    with summarize(summary, keep_inputs=keep_inputs) as summaries:
        for query, key, value in calls:
            attnlab.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                 enable_gqa=True)
    return summaries, calls


def full_weights(query, key, value, **options):
    return attnlab.scaled_dot_product_attention(query, key, value, need_weights=True,
                                                enable_gqa=True, **options)[1]


@pytest.fixture(scope="module")
def recorded():
    return record()


# ---- the page's data, read back ---------------------------------------------------------

def embedded_spec(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', page,
                      re.S)
    assert match, "the page has no data element"
    return json.loads(match.group(1))


def unpack(packed: dict, shape) -> np.ndarray:
    """A packed array back as float64 (or int64 for integers), by the documented format."""
    raw = zlib.decompress(base64.b64decode(packed["data"]))
    bits, kind = packed["bits"], packed["quantization"]
    dtype = {"int": {16: "<i2", 32: "<i4"}, "linear": {8: "u1", 16: "<u2"},
             "log": {8: "u1", 16: "<u2"}}[kind][bits]
    if packed.get("planes"):  # all values' first bytes, then their second bytes, ...
        width = np.dtype(dtype).itemsize
        raw = np.frombuffer(raw, np.uint8).reshape(width, -1).T.tobytes()
    stored = np.frombuffer(raw, dtype=dtype).astype(np.int64)
    assert stored.size == math.prod(shape)
    if kind == "int":
        return stored.reshape(shape)
    top = 2 ** bits - 1
    if kind == "linear":
        scales = np.asarray(packed["scales"], dtype=np.float64)
        groups = stored.reshape(len(scales), -1) * (scales[:, None] / top)
        return groups.reshape(shape)
    lows, highs = (np.log(np.asarray(packed[name], dtype=np.float64)) for name in ("lows", "highs"))
    levels = stored.reshape(len(lows), -1)
    values = np.exp(lows[:, None] + (levels - 1) * ((highs - lows) / (top - 1))[:, None])
    return np.where(levels == 0, 0.0, values).reshape(shape)


def log_half_step(packed: dict) -> np.ndarray:
    """Each group's largest relative error: half a step of its log scale."""
    top = 2 ** packed["bits"] - 1
    span = np.log(np.asarray(packed["highs"]) / np.asarray(packed["lows"]))
    return np.expm1(span / (top - 1) / 2)


def expected_summaries(summaries, layers, batch, heads, name):
    """[batch, layers, heads, ...] of one summary, straight from the recorded calls."""
    stacked = torch.stack([getattr(summaries[l], name) for l in layers], 1).double()
    return stacked[batch][:, :, heads].numpy()


# ---- block weights ----------------------------------------------------------------------

CASES = {
    "causal": dict(is_causal=True),
    "boolean mask": dict(attn_mask="bool"),
    "float mask and causal": dict(attn_mask="float", is_causal=True),
    "boolean mask and causal": dict(attn_mask="bool", is_causal=True),
    "per-head float mask": dict(attn_mask="heads"),
}


def case_mask(kind, batch, heads, length, dtype):
    generator = torch.Generator().manual_seed(7)
    if kind == "bool":  # [batch, 1, L, L]: broadcast over the heads
        mask = torch.rand(batch, 1, length, length, generator=generator) > 0.4
        mask[..., 5, :] = False  # a query that sees no key
        return mask
    if kind == "float":  # [L, L]: broadcast over batch and heads
        return torch.randn(length, length, generator=generator, dtype=dtype)
    return torch.randn(1, heads, length, length, generator=generator, dtype=dtype)


@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["same heads", "grouped", "one key head"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_block_weights_are_the_blocks_of_the_full_weights(case, kv_heads, dtype):
    batch, heads, length, pool = 2, 4, 45, 8  # 6 × 6 blocks, the last 5 wide
    query, key, value = attention_inputs(batch, heads, kv_heads, length, 8, seed=3, dtype=dtype)
    options = dict(CASES[case])
    if "attn_mask" in options:
        options["attn_mask"] = case_mask(options["attn_mask"], batch, heads, length, dtype)
    with summarize(pool=pool, keep_inputs=True) as summaries:
        attnlab.scaled_dot_product_attention(query, key, value, enable_gqa=True, **options)
    weights = full_weights(query, key, value, **options)
    pooled = summaries[0].pooled
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    blocks = math.ceil(length / pool)
    for b in range(batch):
        for h in range(heads):
            for qb in range(blocks):
                for kb in range(blocks):
                    block = summaries.block_weights(0, b, h, qb, kb)
                    expected = weights[b, h, qb * pool:(qb + 1) * pool, kb * pool:(kb + 1) * pool]
                    assert block.shape == expected.shape
                    assert block.dtype == dtype
                    torch.testing.assert_close(block, expected, atol=tolerance, rtol=0)
                    assert abs(block.double().mean().item() - pooled[b, h, qb, kb].item()) \
                        <= tolerance
    # Any rectangle, not only blocks.
    torch.testing.assert_close(summaries.weights(0, 1, 3, slice(7, 30), slice(2, 41)),
                               weights[1, 3, 7:30, 2:41], atol=tolerance, rtol=0)
    torch.testing.assert_close(summaries.weights(0, 0, 2, 44), weights[0, 2, 44:45],
                               atol=tolerance, rtol=0)


def test_inputs_are_kept_as_references_and_recomputing_is_no_call():
    query, key, value = attention_inputs(1, 2, 2, 40, 8)
    query.requires_grad_(True)
    with summarize(pool=8, keep_inputs=True) as summaries:
        out, _ = attnlab.scaled_dot_product_attention(query, key, value, is_causal=True)
        # Recomputing inside the block: the hook must not see it as another call.
        summaries.block_weights(0, 0, 1, 2, 1)
    assert len(summaries) == 1 and len(summaries.inputs) == 1
    kept = summaries.inputs[0]
    assert kept.query.data_ptr() == query.data_ptr() and kept.key.data_ptr() == key.data_ptr()
    assert not kept.query.requires_grad  # no autograd graph kept alive through it
    assert kept.is_causal and kept.attn_mask is None and kept.normalizer == "softmax"
    out.sum().backward()
    assert query.grad is not None


def test_block_weights_of_a_sparse_normalizer():
    query, key, value = attention_inputs(1, 2, 2, 40, 8, dtype=torch.float64)
    with summarize(pool=8, keep_inputs=True) as summaries:
        attnlab.scaled_dot_product_attention(query, key, value, is_causal=True,
                                             normalizer="entmax", alpha=1.7)
    weights = attnlab.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                   normalizer="entmax", alpha=1.7,
                                                   need_weights=True)[1]
    torch.testing.assert_close(summaries.block_weights(0, 0, 1, 4, 2), weights[0, 1, 32:40, 16:24],
                               atol=1e-12, rtol=0)


def test_block_weights_explain_what_they_need():
    query, key, value = attention_inputs(1, 2, 2, 40, 8)
    with summarize(pool=8) as no_inputs:
        attnlab.scaled_dot_product_attention(query, key, value)
    with pytest.raises(ValueError, match="keep_inputs=True"):
        no_inputs.block_weights(0, 0, 0, 0, 0)
    with summarize(entropy=True, keep_inputs=True) as no_pool:
        attnlab.scaled_dot_product_attention(query, key, value)
    with pytest.raises(ValueError, match="pool=P"):
        no_pool.block_weights(0, 0, 0, 0, 0)
    no_pool.weights(0, 0, 0, slice(0, 8))  # a rectangle needs no pool
    with summarize(pool=8, keep_inputs=True) as summaries:
        attnlab.scaled_dot_product_attention(query, key, value)
    for call, message in [((1, 0, 0, 0, 0), "call 1 is out of range"),
                          ((0, 1, 0, 0, 0), "batch 1 is out of range"),
                          ((0, 0, 2, 0, 0), "head 2 is out of range"),
                          ((0, 0, 0, 5, 0), "q_block 5 is out of range"),
                          ((0, 0, 0, 0, -6), "k_block -6 is out of range")]:
        with pytest.raises(IndexError, match=message):
            summaries.block_weights(*call)
    with pytest.raises(ValueError, match="step 1"):
        summaries.weights(0, 0, 0, slice(0, 8, 2))
    with pytest.raises(TypeError, match="keep_inputs must be a bool"):
        summarize(pool=8, keep_inputs=1)


# ---- the page ---------------------------------------------------------------------------

def test_page_is_self_contained_with_both_scripts_and_styles_admitted_by_hash(recorded):
    summaries, _ = recorded
    page = viz.summary_view(summaries).html
    assert page.count("<script") == 2  # the data block and the inline script
    assert not re.search(r"https?://", page)
    assert re.findall(r'\b(?:src|href)="([^"]*)"', page) == ["data:,"]
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page).group(1)
    script = re.search(r"<script>(.*)</script>", page, re.S).group(1)
    style = re.search(r"<style>(.*)</style>", page, re.S).group(1)
    assets = resources.files("attnlab.viz")
    assert script == assets.joinpath("common.js").read_text() + "\n" + \
        assets.joinpath("summary.js").read_text()
    assert style == assets.joinpath("viewer.css").read_text() + "\n" + \
        assets.joinpath("summary.css").read_text()

    def digest(text):
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert f"script-src {digest(script)};" in policy and f"style-src {digest(style)};" in policy
    assert "default-src 'none'" in policy


def test_embedded_summaries_match_the_recorded_ones(recorded):
    summaries, _ = recorded
    tokens = [f"w{i}" for i in range(300)]
    spec = embedded_spec(viz.summary_view(summaries, tokens, batch=[1, 0], layers=[2, 0],
                                          heads=[3, 1, 0], zoom=None).html)
    layers, batch, heads = [2, 0], [1, 0], [3, 1, 0]
    assert (spec["batch"], spec["layers"], spec["heads"]) == (batch, layers, heads)
    assert (spec["queries"], spec["keys"], spec["pool"], spec["k"]) == (300, 300, POOL, TOPK)
    assert spec["query_tokens"] == [tokens, tokens] and spec["key_tokens"] is None
    shape = (2, 2, 3)
    for name, length in (("received", 300), ("entropy", 300)):
        expected = expected_summaries(summaries, layers, batch, heads, name)
        got = unpack(spec[name], shape + (length,))
        bound = log_half_step(spec[name]).reshape(shape + (1,))
        assert np.all(np.abs(got - expected) <= bound * expected + 1e-12), name
        assert np.all(bound < 2.5e-4)  # 16 bits of a log scale: about four digits
    blocks = math.ceil(300 / POOL)
    pooled = expected_summaries(summaries, layers, batch, heads, "pooled")
    got = unpack(spec["pooled"], shape + (blocks, blocks))
    bound = log_half_step(spec["pooled"]).reshape(shape + (1, 1))
    assert np.all(np.abs(got - pooled) <= bound * pooled + 1e-12)
    assert np.array_equal(got == 0, pooled == 0)  # above the causal diagonal: exactly 0

    weights = expected_summaries(summaries, layers, batch, heads, "topk_weights")
    indices = expected_summaries(summaries, layers, batch, heads, "topk_indices")
    distances = unpack(spec["topk_distances"], shape + (300, TOPK))
    assert np.array_equal(np.arange(300)[:, None] - distances, indices)
    top = unpack(spec["topk_top"], shape + (300,))
    ratios = unpack(spec["topk_ratios"], shape + (300, TOPK))
    got = top[..., None] * ratios
    top_step = log_half_step(spec["topk_top"]).reshape(shape + (1,))
    assert np.all(np.abs(top - weights[..., 0]) <= top_step * weights[..., 0] + 1e-12)
    # The others: fractions of the largest in 8 bits of a log scale, half a step of each.
    ratio_step = log_half_step(spec["topk_ratios"]).reshape(shape + (1, 1))
    assert np.all(np.abs(got - weights) <=
                  ((1 + top_step[..., None]) * (1 + ratio_step) - 1) * weights + 1e-12)
    # However much weaker than the sink, no key's weight becomes 0 (only a key the causal
    # mask hides from an early query has 0).
    assert np.array_equal(got > 0, weights > 0) and (weights[..., 1:] > 0).mean() > 0.95
    # The sink: key 0 receives the most in every layer and head shown.
    received = expected_summaries(summaries, layers, batch, heads, "received")
    assert np.all(received.argmax(-1) == 0)
    assert spec["start"] == {"batch": 0, "layer": 0, "head": 0, "query": 299}


def test_zoom_embeds_the_exact_weights_of_the_blocks_asked_for(recorded):
    summaries, calls = recorded
    spec = embedded_spec(viz.summary_view(summaries, zoom=[(1, 2, 9, 3), (0, 0, 4, 4)],
                                          batch=1, zoom_precision=16).html)
    got = {(b["batch"], b["layer"], b["head"], b["q_block"], b["k_block"]): b
           for b in spec["zoom"]}
    assert set(got) == {(0, 1, 2, 9, 3), (0, 0, 0, 4, 4)}
    for (b, layer, head, qb, kb), block in got.items():
        query, key, value = calls[layer]
        weights = full_weights(query, key, value, is_causal=True)[1, head].double()
        expected = weights[qb * POOL:(qb + 1) * POOL, kb * POOL:(kb + 1) * POOL].numpy()
        assert (block["rows"], block["cols"]) == expected.shape
        assert expected.shape == ((12 if qb == 9 else 32), 32)  # the last block row: 300 − 288
        values = unpack(block, expected.shape)
        assert block["bits"] == 16
        assert np.all(np.abs(values - expected) <= log_half_step(block)[0] * expected + 1e-7)
        assert abs(block["mean"] - expected.mean()) < 1e-6
        assert abs(block["mean"] - summaries[layer].pooled[1, head, qb, kb].item()) < 1e-6


def test_automatic_zoom_picks_each_head_s_most_attended_blocks_off_the_diagonal(recorded):
    summaries, _ = recorded
    spec = embedded_spec(viz.summary_view(summaries, layers=[0, 2], heads=[1, 2],
                                          zoom_per_head=3).html)
    chosen = {(b["batch"], b["layer"], b["head"], b["q_block"], b["k_block"])
              for b in spec["zoom"]}
    expected = set()
    for b in range(2):
        for l, layer in enumerate([0, 2]):
            for h, head in enumerate([1, 2]):
                pooled = summaries[layer].pooled[b, head].clone()
                pooled.fill_diagonal_(-1)
                top = pooled.flatten().topk(3).indices
                expected |= {(b, l, h, int(i) // pooled.shape[1], int(i) % pooled.shape[1])
                             for i in top}
    assert chosen == expected
    assert all(block["bits"] == 8 for block in spec["zoom"])
    # With the sink, a head's strongest blocks off the diagonal are in the first key column.
    assert all(k_block == 0 for *_, k_block in chosen)
    none = embedded_spec(viz.summary_view(summaries, zoom=None).html)
    assert none["zoom"] == [] and "zoom=[(layer, head, q_block, k_block)" in none["zoom_note"]


def test_without_kept_inputs_the_page_says_how_to_zoom():
    summaries, _ = record(layers=1, keep_inputs=False)
    spec = embedded_spec(viz.summary_view(summaries).html)
    assert spec["zoom"] == [] and "keep_inputs=True" in spec["zoom_note"]
    with pytest.raises(ValueError, match=r"zoom: .*keep_inputs=True"):
        viz.summary_view(summaries, zoom=[(0, 0, 1, 0)])


def test_a_list_of_attention_summaries_and_missing_summaries(recorded):
    summaries, _ = recorded
    plain = list(summaries)
    spec = embedded_spec(viz.summary_view(plain, pool=POOL).html)
    assert spec["pool"] == POOL and spec["zoom"] == [] and spec["received"] is not None
    with pytest.raises(ValueError, match="pass pool="):
        viz.summary_view(plain)
    with pytest.raises(ValueError, match="pool=29: a 300 × 300 input makes 11 × 11 blocks, "
                                         "but the pooled maps are 10 × 10"):
        viz.summary_view(plain, pool=29)
    query, key, value = attention_inputs(1, 2, 2, 40, 8)
    with summarize(entropy=True) as entropy_only:
        attnlab.scaled_dot_product_attention(query, key, value)
    spec = embedded_spec(viz.summary_view(entropy_only).html)
    assert spec["entropy"] is not None
    assert spec["received"] is spec["pooled"] is spec["topk_top"] is None
    assert "no pooled map" in spec["zoom_note"]
    with pytest.raises(ValueError, match="zoom: .*no pooled map"):
        viz.summary_view(entropy_only, zoom=[(0, 0, 0, 0)])


def test_topk_keeps_the_first_keys_of_each_query(recorded):
    summaries, _ = recorded
    spec = embedded_spec(viz.summary_view(summaries, topk=2, zoom=None).html)
    assert spec["k"] == 2
    distances = unpack(spec["topk_distances"], (2, 3, 4, 300, 2))
    indices = torch.stack([summaries[l].topk_indices for l in range(3)], 1)[..., :2].numpy()
    assert np.array_equal(np.arange(300)[:, None] - distances, indices)


def call_with(recorded, **options):
    summaries, _ = recorded
    return lambda: viz.summary_view(summaries, **options)


BAD = [
    (dict(tokens=["a"] * 299), ValueError, "tokens has 299 tokens but the maps have 300"),
    (dict(tokens="abc"), TypeError, "tokens must be a list of strings"),
    (dict(tokens=[["a"] * 300] * 3), ValueError, "tokens has 3 lists but the maps have batch"),
    (dict(zoom=[(0, 0, 10, 0)]), ValueError, r"zoom: block \(10, 0\) .* out of range: the "
                                             r"pooled map has 10 × 10 blocks"),
    (dict(zoom=[(0, 0, 0, -1)]), ValueError, r"zoom: block \(0, -1\)"),
    (dict(zoom=[(5, 0, 0, 0)]), ValueError, "zoom: layer 5 .* not among the layers shown"),
    (dict(zoom=[(0, 0, 1, 0)], layers=[1, 2]), ValueError, "zoom: layer 0"),
    (dict(zoom=[(0, 3, 1, 0)], heads=[0, 1]), ValueError, "zoom: head 3"),
    (dict(zoom=[(0, 0, 1)]), TypeError, "zoom: each block is a tuple of 4 ints"),
    (dict(zoom=7), TypeError, "zoom must be"),
    (dict(zoom_per_head=-1), ValueError, "zoom_per_head"),
    (dict(zoom_precision=12), ValueError, "zoom_precision must be 8 or 16"),
    (dict(max_zoom_values=1000), ValueError, "more than max_zoom_values=1,000"),
    (dict(topk=6), ValueError, "topk must be an int from 1 to 5"),
    (dict(query=300), ValueError, r"query must be a position in \[0, 300\)"),
    (dict(layer=1, layers=[0, 2]), ValueError, "layer 1 is not among the layers shown"),
    (dict(head=4), ValueError, "head 4 is out of range"),
    (dict(layers=[0, 7]), ValueError, "layers index 7 is out of range"),
    (dict(batch=2), ValueError, "batch index 2 is out of range"),
    (dict(pool=16), ValueError, "pool=16 differs from the block size"),
    (dict(title=3), TypeError, "title must be a str"),
]


@pytest.mark.parametrize("options,error,message", BAD,
                         ids=[f"{i}-{list(o)[0]}" for i, (o, *_) in enumerate(BAD)])
def test_bad_input_is_refused_with_a_message_naming_it(recorded, options, error, message):
    with pytest.raises(error, match=message):
        call_with(recorded, **options)()


def test_summaries_themselves_are_checked():
    with pytest.raises(TypeError, match="summaries must be what attnlab.interpret.summarize"):
        viz.summary_view(torch.zeros(3))
    with summarize(entropy=True) as empty:
        pass
    with pytest.raises(ValueError, match="no attention call"):
        viz.summary_view(empty)
    with summarize(received=True, pool=8) as two_shapes:
        for length in (40, 48):
            attnlab.scaled_dot_product_attention(*attention_inputs(1, 2, 2, length, 8))
    with pytest.raises(ValueError, match="layers: call 1's received has shape"):
        viz.summary_view(two_shapes)
    viz.summary_view(two_shapes, layers=[1])  # one shape: fine
    with pytest.raises(ValueError, match="pass key_tokens"):
        with summarize(received=True, entropy=True) as cross:
            query, key, value = attention_inputs(1, 2, 2, 40, 8)
            attnlab.scaled_dot_product_attention(query[:, :, :30], key, value)
        viz.summary_view(cross, [str(i) for i in range(30)])
    spec = embedded_spec(viz.summary_view(cross, [str(i) for i in range(30)],
                                          [f"k{i}" for i in range(40)]).html)
    assert spec["cross"] and spec["key_tokens"] == [[f"k{i}" for i in range(40)]]
    assert (spec["queries"], spec["keys"]) == (30, 40)


def test_size_of_a_16384_token_4_layer_4_head_page():
    # Random queries and keys attend almost evenly, so each query's top keys lie anywhere in
    # the context: the hardest case to compress. (A trained model's nearby keys and sinks
    # compress far better.) The sizes are those summary_view's docstring gives.
    length, pool = 16384, 256
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad(), summarize(received=True, entropy=True, topk=8, pool=pool,
                                    keep_inputs=True) as summaries:
        for _ in range(4):
            query, key, value = (torch.randn(1, 4, length, 64, generator=generator)
                                 for _ in range(3))
            attnlab.scaled_dot_product_attention(query, key, value, is_causal=True)
    tokens = [f"t{i}" for i in range(length)]
    page = viz.summary_view(summaries, tokens).html
    spec = embedded_spec(page)
    assert len(spec["zoom"]) == 4 * 4 * 2  # two blocks per head
    size = len(page.encode())
    without_zoom = len(viz.summary_view(summaries, tokens, zoom=None).html.encode())
    four_keys = len(viz.summary_view(summaries, tokens, topk=4).html.encode())
    print(f"16,384 tokens: {size / 1e6:.1f} MB; {without_zoom / 1e6:.1f} MB without zoom "
          f"blocks; {four_keys / 1e6:.1f} MB with topk=4")
    assert 10e6 < size < 11.5e6
    assert 2e6 < size - without_zoom < 2.6e6
    assert 2.9e6 < size - four_keys < 3.6e6
