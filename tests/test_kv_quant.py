"""minengine.course.kv_quant: fake-quantised KV cache (lesson 04, section 6).

The rounding itself (int8 closer than int4, grid values exact, zeros kept, coarser scales worse), the bytes
it would save, and the hooks: they round what the engine writes into its cache, and leave no trace once
the block ends (the default engine's results are unchanged).
"""

from __future__ import annotations

import pytest
import torch

from minengine import LLM
from minengine.course import kv_quant as kq
from minengine.engine.threads import torch_threads
from minengine.kvcalc import kv_bytes_per_token as kvcalc_bytes_per_token
from minengine.perf.model_input import spec_from_model_config


def test_int8_error_is_smaller_than_int4_error() -> None:
    x = torch.randn(64, 2, 32, generator=torch.Generator().manual_seed(0))
    for scheme in kq.SCHEMES:
        err8 = (kq.fake_quantize(x, 8, scheme) - x).abs().max()
        err4 = (kq.fake_quantize(x, 4, scheme) - x).abs().max()
        assert 0 < err8 < err4 / 10, scheme
        # absmax rounding: no value moves by more than half a grid step
        step = x.abs().amax(dim=-1, keepdim=True) / kq.qmax(4)
        assert ((kq.fake_quantize(x, 4, "per-head") - x).abs() <= step / 2 + 1e-6).all()


def test_values_on_the_grid_round_trip_exactly() -> None:
    ints = torch.randint(-7, 8, (10, 2, 8), generator=torch.Generator().manual_seed(1)).float()
    ints[..., 0] = 7  # every group reaches the grid's end, so the scale is exactly 0.25
    x = ints * 0.25
    assert torch.equal(kq.fake_quantize(x, 4, "per-head"), x)
    assert torch.equal(kq.fake_quantize(x, 4, "per-token"), x)
    zeros = torch.zeros(3, 2, 4)
    assert torch.equal(kq.fake_quantize(zeros, 8), zeros)
    assert kq.fake_quantize(x.double(), 8).dtype == torch.float64


def test_per_token_scales_are_coarser_than_per_head_ones() -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(256, 2, 32, generator=gen)
    x[:, 1] *= 20  # one head much larger: a shared scale wastes the small head's grid
    small = x[:, 0]
    per_head = (kq.fake_quantize(x, 4, "per-head")[:, 0] - small).pow(2).mean()
    per_token = (kq.fake_quantize(x, 4, "per-token")[:, 0] - small).pow(2).mean()
    assert per_token > 4 * per_head


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="bits"):
        kq.fake_quantize(torch.ones(1, 1, 4), 16)
    with pytest.raises(ValueError, match="scheme"):
        kq.fake_quantize(torch.ones(1, 1, 4), 8, "per-block")
    with pytest.raises(ValueError, match="tokens, kv_heads"):
        kq.fake_quantize(torch.ones(4, 4), 8)


def test_bytes_per_token_match_kvcalc_and_count_the_scales(tiny_llm: LLM) -> None:
    config = tiny_llm.llm_engine.model.config
    spec = spec_from_model_config(config)
    assert kq.kv_bytes_per_token(config, None, dtype_bytes=2) == kvcalc_bytes_per_token(spec, "bf16")
    elements = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    scales_per_head = 2 * config.num_hidden_layers * config.num_key_value_heads
    assert kq.kv_bytes_per_token(config, 8) == elements + 2 * scales_per_head
    assert kq.kv_bytes_per_token(config, 4) == elements / 2 + 2 * scales_per_head
    assert kq.kv_bytes_per_token(config, 4, "per-token") == elements / 2 + 2 * 2 * config.num_hidden_layers


def test_agreement_counts_positions_and_the_common_prefix() -> None:
    assert kq.agreement([[1, 2, 3, 4]], [[1, 2, 3, 4]]) == (1.0, 1.0)
    assert kq.agreement([[1, 2, 3, 4]], [[1, 9, 3, 4]]) == (0.75, 0.25)
    assert kq.agreement([[1, 2], [5, 6]], [[1, 2], [0, 6]]) == (0.75, 0.5)


@pytest.fixture(scope="module")
def tiny_llm() -> LLM:
    with torch_threads(1):
        return LLM(enable_prefix_caching=False, kv_cache_memory_bytes=16 * 2**20)


def _greedy(llm: LLM, prompts: list[list[int]], n: int = 24) -> list[list[int]]:
    with torch_threads(1):
        return kq.greedy_tokens(llm, prompts, n)


def test_hooks_round_what_the_engine_caches_and_leave_no_trace(tiny_llm: LLM) -> None:
    tok = tiny_llm.get_tokenizer()
    prompts = [tok.encode(s)[:20] for s in kq.heldout_stories(6)]
    before = _greedy(tiny_llm, prompts)
    with kq.quantized_kv_cache(tiny_llm, 4, "per-head"):
        quantized = _greedy(tiny_llm, prompts)
    fresh = LLM(enable_prefix_caching=False, num_blocks=8)  # a clean cache: every stored row is from below
    with kq.quantized_kv_cache(fresh, 4, "per-head"):
        _greedy(fresh, prompts[:1], 8)
    for cache in fresh.llm_engine.kv_cache.kv_caches[0]:
        rows = cache.view(-1, cache.shape[2], cache.shape[3])
        rows = rows[rows.abs().amax(dim=-1).amin(dim=-1) > 0]  # the slots that were written
        assert len(rows) >= 20
        steps = rows / (rows.abs().amax(dim=-1, keepdim=True) / kq.qmax(4))  # each token-head on its grid
        assert torch.allclose(steps, steps.round(), atol=1e-3)
    after = _greedy(tiny_llm, prompts)
    assert after == before, "the hooks were not removed: the default engine's results changed"
    assert quantized != before, "int4 rounding of every key and value changed no token: the hooks did nothing"
    with kq.quantized_kv_cache(tiny_llm, None):  # bits=None is the reference run
        assert _greedy(tiny_llm, prompts) == before


def test_hooks_are_removed_after_an_error(tiny_llm: LLM) -> None:
    decoder = tiny_llm.llm_engine.model.model
    with pytest.raises(RuntimeError, match="boom"), kq.quantized_kv_cache(tiny_llm, 8):
        assert decoder.rotary_emb._forward_hooks
        raise RuntimeError("boom")
    assert not decoder.rotary_emb._forward_hooks
    assert not any(layer.self_attn.v_proj._forward_hooks for layer in decoder.layers)


def test_perplexity_rises_with_coarser_caches(tiny_llm: LLM) -> None:
    tok = tiny_llm.get_tokenizer()
    ids = tok.encode("".join(kq.heldout_stories(4)))
    with torch_threads(1):
        base = kq.perplexity(tiny_llm, ids)
        with kq.quantized_kv_cache(tiny_llm, 8):
            p8 = kq.perplexity(tiny_llm, ids)
        with kq.quantized_kv_cache(tiny_llm, 2):
            p2 = kq.perplexity(tiny_llm, ids)
    assert 1 < base < 3  # the model card's held-out perplexity is 1.4
    assert abs(p8 - base) < 0.01 * base
    assert p2 > 1.05 * base
    with pytest.raises(ValueError):
        kq.perplexity(tiny_llm, ids[:1])
