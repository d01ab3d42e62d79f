"""The decode hot path (issue 13): fused projections that still speak HF names, RoPE and attention
metadata built once per forward, and fewer small ops per layer. Work is counted, never timed."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hf_utils import FAMILIES, load_hf_reference
from torch.utils._python_dispatch import TorchDispatchMode

from minengine.models import AttentionMetadata, allocate_kv_cache, load_model
from minengine.models.attention import reference as attention_module
from minengine.models.llama import RMSNorm, RotaryEmbedding
from minengine.models.loader import build_random_model

pytestmark = pytest.mark.usefixtures("torch_one_thread")

_SMALL = dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, vocab_size=128, max_position_embeddings=128,
              attention_bias=True, tie_word_embeddings=False)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_state_dict_has_exactly_the_checkpoints_names_and_values(hf_model_dir, family):
    path = hf_model_dir(family)
    ours, hf = load_model(path, device="cpu"), load_hf_reference(path)
    tied = {"lm_head.weight"} if ours.config.tie_word_embeddings else set()  # the embedding, by another name
    theirs = {k: v for k, v in hf.state_dict().items() if k not in tied}
    mine = {k: v for k, v in ours.state_dict().items() if k not in tied}
    assert set(mine) == set(theirs)
    for name, value in theirs.items():
        assert torch.equal(mine[name], value), name
    layer = ours.model.layers[0]
    assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "gate_proj")  # fused for real
    assert (isinstance(layer.self_attn.qkv_proj, torch.nn.Linear)
            and isinstance(layer.mlp.gate_up_proj, torch.nn.Linear))


def test_state_dict_round_trips_and_fused_rows_are_q_k_v_in_order():
    a = build_random_model(_SMALL, seed=1)
    b = build_random_model(_SMALL, seed=2)
    b.load_state_dict(a.state_dict())  # HF names in, fused tensors filled
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)
    attn = a.model.layers[1].self_attn
    sd = a.state_dict()
    rows = torch.cat([sd[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(rows, attn.qkv_proj.weight)
    assert torch.equal(torch.cat([sd[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"]),
                       attn.qkv_proj.bias)


def test_an_incomplete_set_of_parts_is_reported_by_its_checkpoint_names():
    model = build_random_model(_SMALL, seed=1)
    sd = model.state_dict()
    del sd["model.layers.0.self_attn.k_proj.weight"]
    with pytest.raises(RuntimeError) as err:
        build_random_model(_SMALL, seed=2).load_state_dict(sd)
    assert "model.layers.0.self_attn.q_proj.weight" in str(err.value)  # left alone: named as unexpected


def test_random_weights_are_what_they_were_before_fusing():
    """The builder draws the fused matrices in the old q, k, v, o, gate, up, down order; for sizes that
    are multiples of 16 (every shape here and in the lessons) torch's normal_ then gives the same numbers,
    so random-model figures did not change when the projections were fused."""
    seed, std = 3, 0.1
    sd = build_random_model(_SMALL, seed=seed, std=std).state_dict()
    gen = torch.Generator().manual_seed(seed)
    names = ["model.embed_tokens.weight"]
    for i in range(_SMALL["num_hidden_layers"]):
        names += [f"model.layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"]
        names += [f"model.layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
    names.append("lm_head.weight")
    for name in names:
        assert torch.equal(torch.empty_like(sd[name]).normal_(0.0, std, generator=gen), sd[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_the_textbook_formula(dtype):
    norm = RMSNorm(48, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(48))
    x = torch.randn(5, 48).to(dtype)
    xf = x.float()
    expected = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)  # HF's
    torch.testing.assert_close(norm(x), expected, atol=1e-6 if dtype == torch.float32 else 0, rtol=1e-6 if
                               dtype == torch.float32 else 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_hfs_rotate_half_exactly(dtype):
    model = build_random_model({**_SMALL, "num_attention_heads": 4, "num_key_value_heads": 2}, seed=0)
    rope: RotaryEmbedding = model.model.rotary_emb
    positions = torch.tensor([0, 5, 17, 90])
    qk = torch.randn(4, 6, 16).to(dtype)
    q, k = rope(rope.tables(positions, dtype), qk, 4)
    freqs = torch.outer(positions.float(), rope.cos_cached.new_tensor(1.0) * _inv_freq(rope))
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)
    x1, x2 = qk.chunk(2, -1)
    expected = qk * cos + torch.cat((-x2, x1), -1) * sin  # transformers' apply_rotary_pos_emb
    assert torch.equal(torch.cat((q, k), 1), expected)
    assert q.shape == (4, 4, 16) and k.shape == (4, 2, 16)


def _inv_freq(rope: RotaryEmbedding) -> torch.Tensor:
    from minengine.models.llama import rope_inv_freq

    return rope_inv_freq(rope.config)


def _decode_once(model, context: int = 20):
    """A prefill of ``context`` tokens, then the metadata and inputs of one decode step."""
    cfg = model.config
    caches = allocate_kv_cache(cfg.num_hidden_layers, 8, 16, cfg.num_key_value_heads, cfg.head_dim)
    table = [3, 1]
    prefill = AttentionMetadata.build([context], [context], [table], 16)
    with torch.inference_mode():
        model(torch.arange(3, 3 + context), prefill.positions(), prefill, caches)
    meta = AttentionMetadata.build([1], [context + 1], [table], 16)
    return torch.tensor([7]), meta, caches


def test_rope_tables_and_gather_indices_are_built_once_per_forward(monkeypatch):
    model = build_random_model({**_SMALL, "num_hidden_layers": 4}, seed=0)
    ids, meta, caches = _decode_once(model)
    calls: Counter[str] = Counter()
    tables, groups = RotaryEmbedding.tables, attention_module._decode_groups

    def count_tables(self, *a):
        calls["tables"] += 1
        return tables(self, *a)

    def count_groups(*a):
        calls["groups"] += 1
        return groups(*a)

    monkeypatch.setattr(RotaryEmbedding, "tables", count_tables)
    monkeypatch.setattr(attention_module, "_decode_groups", count_groups)
    with torch.inference_mode():
        model(ids, meta.positions(), meta, caches)
    assert calls == {"tables": 1, "groups": 1}  # not once per layer (4 layers)


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def _ops_of_one_decode(layers: int) -> Counter[str]:
    model = build_random_model({**_SMALL, "num_hidden_layers": layers, "attention_bias": False}, seed=0)
    ids, meta, caches = _decode_once(model)
    with torch.inference_mode(), _CountOps() as counter:
        model(ids, meta.positions(), meta, caches)
    return counter.ops


def test_a_decode_layer_runs_few_ops():
    """Every small op costs microseconds of dispatch on a CPU, whatever its size: count them per layer
    (the difference between a 4- and a 2-layer model, so the once-per-forward work drops out).

    Before this work a batch-1 decode layer dispatched 76 ops: 7 GEMVs, two 6-op RMSNorms, ~20 for RoPE
    with its own table lookup, 12 no-op ``.to()`` calls, an index scatter of attention's output. Now 35:
    4 GEMVs (q/k/v and gate/up fused), 2 fused RMSNorms, 6 ops of RoPE for q and k together."""
    two, four = _ops_of_one_decode(2), _ops_of_one_decode(4)
    per_layer = Counter({k: (four[k] - two[k]) // 2 for k in four if four[k] != two[k]})
    print(f"\n{sum(per_layer.values())} ops per layer: {dict(per_layer.most_common())}")
    assert per_layer["linear"] == 4 and per_layer["rms_norm"] == 2, per_layer
    assert "to" not in per_layer and "index_put_" not in per_layer and "index" not in per_layer, per_layer
    assert sum(per_layer.values()) <= 36, per_layer


def test_a_lone_decode_skips_the_scatter_and_gives_the_same_output():
    """Batch 1 (or a whole step in one in-order group) returns SDPA's output without an index scatter;
    the general path (the same decode next to another sequence) gives the same numbers."""
    model = build_random_model(_SMALL, seed=0)
    ids, meta, caches = _decode_once(model, context=20)
    assert isinstance(meta_groups(meta, model)[0].rows, slice)
    with torch.inference_mode():
        alone = model.compute_logits(model(ids, meta.positions(), meta,
                                           [(k.clone(), v.clone()) for k, v in caches]))
        # the same decode second in a batch after a 3-token prefill of another sequence
        pair = AttentionMetadata.build([3, 1], [3, 21], [[5], [3, 1]], 16)
        both = model.compute_logits(model(torch.tensor([9, 8, 7, 7]), pair.positions(), pair, caches))
    torch.testing.assert_close(both[3:4], alone, atol=1e-5, rtol=1e-5)


def meta_groups(meta: AttentionMetadata, model) -> list:
    meta.prepare(torch.device("cpu"), model.model.sliding_windows)
    return meta.decode_groups[None]
