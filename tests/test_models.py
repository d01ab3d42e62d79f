"""minengine's decoder against transformers, family by family (random weights, no downloads)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hf_utils import FAMILIES, hf_config, load_hf_reference

from minengine.models import AttentionMetadata, ModelConfig, allocate_kv_cache, load_model, paged_attention
from minengine.models.errors import UnsupportedModelError
from minengine.models.llama import rope_inv_freq

pytestmark = pytest.mark.usefixtures("torch_one_thread")

FAMILY_NAMES = list(FAMILIES)
ATOL = 1e-4


def _prompts(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


class PagedKV:
    """A minimal stand-in for the engine's block manager: hands out blocks from a shuffled pool, so
    block tables are non-contiguous and out of order."""

    def __init__(self, model, num_blocks: int, block_size: int, seed: int = 0) -> None:
        cfg = model.config
        self.block_size = block_size
        self.caches = allocate_kv_cache(
            cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, model.dtype
        )
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[int, list[int]] = {}

    def step_metadata(self, new_tokens: dict[int, int], seq_lens: dict[int, int]) -> AttentionMetadata:
        """Grow each sequence's block table to hold seq_lens[s] tokens, then describe the step."""
        for s, n in seq_lens.items():
            table = self.tables.setdefault(s, [])
            while len(table) * self.block_size < n:
                table.append(self.free.pop())
        seqs = list(new_tokens)
        return AttentionMetadata.build(
            [new_tokens[s] for s in seqs],
            [seq_lens[s] for s in seqs],
            [self.tables[s] for s in seqs],
            self.block_size,
        )


def _run(model, tokens: list[list[int]], meta: AttentionMetadata, caches=None) -> torch.Tensor:
    ids = torch.tensor([t for seq in tokens for t in seq], dtype=torch.long)
    with torch.no_grad():
        return model.compute_logits(model(ids, meta.positions(), meta, caches))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_packed_prefill_matches_hf(family, hf_model_dir):
    path = hf_model_dir(family)
    ours, ref = load_model(path, device="cpu"), load_hf_reference(path)
    prompts = _prompts([7, 19, 33], ours.config.vocab_size, seed=1)
    meta = AttentionMetadata.for_prefill([len(p) for p in prompts])
    logits = _run(ours, prompts, meta)
    assert logits.shape == (sum(map(len, prompts)), ours.config.vocab_size)
    for i, p in enumerate(prompts):
        with torch.no_grad():
            expected = ref(torch.tensor([p])).logits[0]
        got = logits[meta.query_start_loc[i] : meta.query_start_loc[i + 1]]
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_chunked_prefill_in_paged_cache_matches_one_pass(family, hf_model_dir):
    model = load_model(hf_model_dir(family), device="cpu")
    a, b = _prompts([41, 9], model.config.vocab_size, seed=2)
    full_a = _run(model, [a], AttentionMetadata.for_prefill([len(a)]))
    full_b = _run(model, [b], AttentionMetadata.for_prefill([len(b)]))

    kv = PagedKV(model, num_blocks=40, block_size=4)
    # Step 1: the first 17 tokens of A (not block-aligned).
    _run(model, [a[:17]], kv.step_metadata({0: 17}, {0: 17}), kv.caches)
    # Step 2, a mixed batch: the rest of A (24 tokens after 17 cached ones) packed with all of B.
    meta = kv.step_metadata({0: len(a) - 17, 1: len(b)}, {0: len(a), 1: len(b)})
    assert sorted(kv.tables[0]) != kv.tables[0], "block table should be out of order"
    logits = _run(model, [a[17:], b], meta, kv.caches)
    torch.testing.assert_close(logits[: len(a) - 17], full_a[17:], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[len(a) - 17 :], full_b, atol=ATOL, rtol=0)
    # Step 3: one more token of A as a decode reads all 41 cached tokens through the block table.
    nxt = int(full_a[-1].argmax())
    step = _run(model, [[nxt]], kv.step_metadata({0: 1}, {0: len(a) + 1}), kv.caches)
    one_pass = _run(model, [a + [nxt]], AttentionMetadata.for_prefill([len(a) + 1]))
    torch.testing.assert_close(step[-1], one_pass[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_batched_greedy_decode_matches_hf_generate(family, hf_model_dir):
    path = hf_model_dir(family)
    model, ref = load_model(path, device="cpu"), load_hf_reference(path)
    new_tokens = 64
    prompts = _prompts([5, 12, 20], model.config.vocab_size, seed=3)

    kv = PagedKV(model, num_blocks=64, block_size=8, seed=1)
    seqs = [list(p) for p in prompts]
    lens = {i: len(p) for i, p in enumerate(prompts)}
    meta = kv.step_metadata(dict(lens), lens)  # prefill all three in one packed step
    logits = _run(model, seqs, meta, kv.caches)[meta.last_token_indices()]
    for _ in range(new_tokens):
        for s, row in zip(seqs, logits.argmax(-1).tolist(), strict=True):
            s.append(row)
        lens = {i: len(s) for i, s in enumerate(seqs)}
        meta = kv.step_metadata(dict.fromkeys(lens, 1), lens)  # all decodes in one batch
        logits = _run(model, [[s[-1]] for s in seqs], meta, kv.caches)

    ref.generation_config.eos_token_id = None  # generate exactly new_tokens tokens, like our loop
    for prompt, ours in zip(prompts, seqs, strict=True):
        with torch.no_grad():
            out = ref.generate(
                torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False, pad_token_id=0
            )
        expected = out[0].tolist()
        assert ours == expected
        generated = ours[len(prompt) :]
        assert len(generated) == new_tokens
        assert len(set(generated)) >= 8, f"random model too repetitive to prove anything: {generated}"


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_bf16_is_finite_and_close_to_fp32(family, hf_model_dir):
    path = hf_model_dir(family)
    fp32, bf16 = load_model(path, device="cpu"), load_model(path, dtype="bf16", device="cpu")
    assert bf16.dtype == torch.bfloat16 and bf16.model.rotary_emb.cos_cached.dtype == torch.float32
    prompts = _prompts([10, 30], fp32.config.vocab_size, seed=4)
    meta = AttentionMetadata.for_prefill([10, 30])
    ref, got = _run(fp32, prompts, meta), _run(bf16, prompts, meta)
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    assert (got.float() - ref).abs().max() < 0.1 * ref.abs().max()
    assert (got.float().argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_paged_attention_matches_naive_softmax():
    """Mixed batch (two decodes at different lengths + a chunk), with and without a sliding window."""
    torch.manual_seed(0)
    hq, hkv, d, bs = 4, 2, 8, 4
    seq_lens, query_lens = [9, 3, 14], [1, 1, 6]
    tables = [[5, 0, 7], [2], [9, 1, 3, 8]]
    k_all = [torch.randn(n, hkv, d) for n in seq_lens]
    v_all = [torch.randn(n, hkv, d) for n in seq_lens]
    q = torch.randn(sum(query_lens), hq, d)
    for window in (None, 4):
        cache = allocate_kv_cache(1, 10, bs, hkv, d, torch.float32, "cpu")[0]
        meta = AttentionMetadata.build(query_lens, seq_lens, tables, bs)
        # Pre-fill the cached context; the new tokens' K/V are written by paged_attention itself.
        for i, (n, m) in enumerate(zip(seq_lens, query_lens, strict=True)):
            for p in range(n - m):
                slot = tables[i][p // bs] * bs + p % bs
                cache[0].view(-1, hkv, d)[slot], cache[1].view(-1, hkv, d)[slot] = k_all[i][p], v_all[i][p]
        new_k = torch.cat([k[n - m :] for k, n, m in zip(k_all, seq_lens, query_lens, strict=True)])
        new_v = torch.cat([v[n - m :] for v, n, m in zip(v_all, seq_lens, query_lens, strict=True)])
        out = paged_attention(q, new_k, new_v, cache, meta, d**-0.5, window)
        for i, (n, m) in enumerate(zip(seq_lens, query_lens, strict=True)):
            rows = slice(meta.query_start_loc[i], meta.query_start_loc[i + 1])
            k = k_all[i].repeat_interleave(hq // hkv, dim=1)  # [n, hq, d]
            v = v_all[i].repeat_interleave(hq // hkv, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q[rows], k) / math.sqrt(d)
            qpos, kpos = torch.arange(n - m, n)[:, None], torch.arange(n)[None]
            allowed = (kpos <= qpos) & ((kpos > qpos - window) if window else True)
            scores = scores.masked_fill(~allowed, float("-inf"))
            expected = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
            torch.testing.assert_close(out[rows], expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rope_type", ["llama3", "linear"])
def test_rope_scaling_matches_transformers(rope_type):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "linear", "factor": 4.0}
    if rope_type == "llama3":
        scaling = dict(FAMILIES["llama3"][1]["rope_scaling"])
    hf = hf_config("llama", rope_scaling=scaling, max_position_embeddings=1024)
    ours = rope_inv_freq(ModelConfig.from_hf(hf))
    expected, _ = ROPE_INIT_FUNCTIONS[rope_type](hf, "cpu")
    torch.testing.assert_close(ours, expected.float(), atol=0, rtol=0)
    plain = rope_inv_freq(ModelConfig.from_hf(hf_config("llama")))
    assert not torch.equal(ours, plain), "scaling should change some frequencies"


def test_config_reads_transformers_4_spelling_and_qwen_windows():
    old = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
        "rope_theta": 500000.0, "torch_dtype": "bfloat16",
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    }  # fmt: skip
    cfg = ModelConfig.from_hf(old)
    assert (cfg.head_dim, cfg.num_key_value_heads, cfg.rope_theta) == (8, 8, 500000.0)
    assert cfg.rope_scaling is not None and cfg.rope_scaling["rope_type"] == "llama3"
    assert cfg.torch_dtype == "bfloat16" and not cfg.attention_bias and cfg.sliding_window is None

    qwen = {**old, "architectures": ["Qwen2ForCausalLM"], "rope_scaling": None}
    cfg = ModelConfig.from_hf({**qwen, "sliding_window": 4096, "use_sliding_window": False})
    assert cfg.attention_bias and not cfg.o_proj_bias and cfg.sliding_window is None
    cfg = ModelConfig.from_hf(
        {**qwen, "sliding_window": 64, "use_sliding_window": True, "max_window_layers": 1}
    )
    assert [cfg.layer_sliding_window(i) for i in range(2)] == [None, 64]

    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_hf({**old, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})


# ------------------------------------------------------------------ one parser of the shared HF facts
_SMALL = {"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.mark.parametrize(("extra", "windows"), [
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, [None] * 4),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 24}, [24] * 4),
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": None}, [None] * 4),
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 24}, [None] * 4),  # off
    ({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 24,
      "use_sliding_window": True, "max_window_layers": 2}, [None, None, 24, 24]),
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "sliding_window": 24,
      "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"] * 2},
     [None, 24, None, 24]),
    ({"model_type": "qwen3", "sliding_window": 24, "use_sliding_window": False}, [None] * 4),
])  # fmt: skip
def test_model_config_and_kv_calculator_read_the_same_windows_and_dtype(extra, windows) -> None:
    from minengine.perf.model_spec import from_hf_config

    cfg = {**_SMALL, **extra, "torch_dtype": "torch.bfloat16"}
    mc = ModelConfig.from_hf(cfg)
    assert ([mc.layer_sliding_window(i) for i in range(4)] == list(from_hf_config(cfg).layer_windows)
            == windows)
    assert mc.sliding_window == max((w for w in windows if w), default=None)
    assert mc.torch_dtype == "bfloat16" and from_hf_config(cfg).dtype == "bf16"
    wrapped = ModelConfig.from_hf({"architectures": cfg.get("architectures"), "model_type": "x",
                                   "text_config": cfg})
    assert wrapped.layer_types == mc.layer_types and wrapped.hidden_size == 64  # text_config flattened


def test_random_model_builder_and_thread_helper() -> None:
    from minengine.engine.threads import set_torch_threads, torch_threads
    from minengine.models.loader import build_random_model

    a = build_random_model({**_SMALL, "architectures": ["LlamaForCausalLM"]}, device="cpu", seed=1)
    b = build_random_model(a.config, device="cpu", seed=1)
    assert a.dtype == torch.float32 and not any(p.requires_grad for p in a.parameters())
    assert all(torch.equal(x, y)
               for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    before = torch.get_num_threads()
    with torch_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    with torch_threads(None):
        assert torch.get_num_threads() == before
    assert torch.get_num_threads() == before == set_torch_threads(0)
