"""Lab 1's hidden cases for one course seed (instructor-only: params.py never reaches the release).

``params(seed)`` returns the values that fill the ``@@name@@`` placeholders of the hidden-test blocks:
lists of cases with their expected answers, made up per seed from random but realistic model shapes
(layers, heads, K/V heads from the heads' divisors, head_dim given or derived, the K/V-heads key left out
for MHA, 1-, 2- and 4-byte elements, contexts that are no block multiple, a GPU whose weights do not fit,
sliding-window layers, MLA, tensor parallelism, a capacity plan, the longest context N sequences can
hold) and engine settings for part 5. The expected numbers come from ``minengine.kvcalc`` (it runs here,
at release, on the instructor's machine); part 5's expected answers come from the engine itself, run by
the hidden test.
"""

from __future__ import annotations

import math
import random
from typing import Any

from minengine import kvcalc

GiB = 2**30
KV_DTYPE = {1: "fp8", 2: "bf16", 4: "fp32"}
BLOCK_TOKENS = 2048  # keep every engine setting's prompts within one step's token budget (no chunking)


def _per_token(config: dict[str, Any], nbytes: int, tp: int = 1) -> int:
    spec = kvcalc.load_model_spec(config)
    return kvcalc.kv_bytes_per_token(spec, kv_cache_dtype=KV_DTYPE[nbytes], tensor_parallel_size=tp)


def _dense(rng: random.Random, kind: str, explicit_head_dim: bool = False) -> dict[str, Any]:
    """A Llama-style config. kind: mha, mha_no_key, gqa, mqa, odd_head_dim (head_dim != hidden/heads)."""
    head_dim = rng.choice([64, 80, 96, 128])
    heads = rng.choice([16, 20, 24, 28, 32, 40, 48, 56, 64])
    layers = rng.choice([16, 22, 24, 26, 28, 30, 32, 36, 40, 42, 48, 60, 64, 80])
    hidden = heads * head_dim
    if kind == "odd_head_dim":  # Gemma-7B style: 16 heads of 256 over a 3072 hidden size
        head_dim = rng.choice([128, 192, 256])
        hidden = heads * rng.choice([d for d in (64, 96, 112, 160) if d != head_dim])
    kv = {"mha": heads, "mha_no_key": heads, "odd_head_dim": heads, "mqa": 1}.get(kind)
    if kind == "gqa":
        kv = rng.choice([d for d in range(2, heads // 2 + 1) if heads % d == 0])
    config: dict[str, Any] = {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
        "intermediate_size": 256 * round(hidden * 8 / 3 / 256), "num_attention_heads": heads,
        "num_key_value_heads": kv, "vocab_size": rng.choice([32_000, 50_304, 65_536, 128_256, 152_064]),
    }
    if kind == "mha_no_key":
        del config["num_key_value_heads"]
    if explicit_head_dim or kind == "odd_head_dim":
        config["head_dim"] = head_dim
    return config


def _bytes_case(config: dict[str, Any], nbytes: int) -> dict[str, Any]:
    return {"config": config, "nbytes": nbytes, "want": _per_token(config, nbytes)}


def _capacity_case(rng: random.Random, config: dict[str, Any], ctx: int, block: int, gpu_gib: int,
                   params_b: float, wbytes: int, util: float, reserve_gib: int) -> dict[str, Any]:
    weights = int(params_b * 1e9) * wbytes
    gpu = gpu_gib * GiB
    nbytes = rng.choice([1, 2])
    budget = int(gpu * util) - weights - reserve_gib * GiB
    slots = -(-ctx // block) * block  # token slots of one sequence's whole blocks
    want = max(0, budget) // (slots * _per_token(config, nbytes))
    return {"config": config, "context_len": ctx, "gpu_memory_bytes": gpu, "weight_bytes": weights,
            "bytes_per_element": nbytes, "gpu_memory_utilization": util, "reserve_bytes": reserve_gib * GiB,
            "block_size": block, "want": want, "budget": budget, "slots": slots}


def _hybrid(rng: random.Random) -> dict[str, Any]:
    config = _dense(rng, "gqa", explicit_head_dim=True)
    n = config["num_hidden_layers"]
    every = rng.choice([2, 4, 6])  # one full-attention layer every `every` layers (gpt-oss: 2, Gemma 3: 6)
    config["layer_types"] = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                             for i in range(n)]
    config["sliding_window"] = rng.choice([512, 1024, 4096])
    return config


def _mla(rng: random.Random) -> dict[str, Any]:
    heads = rng.choice([16, 32, 64, 128])
    return {"model_type": "deepseek_v3", "num_hidden_layers": rng.choice([27, 30, 47, 60, 61]),
            "hidden_size": rng.choice([2048, 5120, 7168]), "num_attention_heads": heads,
            "num_key_value_heads": heads, "kv_lora_rank": rng.choice([256, 512]),
            "q_lora_rank": rng.choice([None, 1536]), "qk_rope_head_dim": rng.choice([32, 64]),
            "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129_280}


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _admitted_at_once(prompts: list[int], num_blocks: int, block: int) -> int:
    """Step 1: requests are admitted in order while their prompts' blocks fit; the first misfit stops it."""
    free, n = num_blocks, 0
    for p in prompts:
        if _blocks(p, block) > free:
            break
        free, n = free - _blocks(p, block), n + 1
    return n


def _first_preemption_step(prompts: list[int], outputs: list[int], num_blocks: int, block: int) -> int | None:
    """The engine's rule (decode-first, no prefix caching, prompts within the token budget), to pick
    settings that show what a setting is meant to show. The hidden test asks the engine itself."""
    waiting, running, free, step = list(zip(prompts, outputs, strict=True)), [], num_blocks, 0
    while waiting or running:
        step += 1
        need = sum(_blocks(r[0] + 1, block) - _blocks(r[0], block) for r in running)
        if need > free:
            return step
        free -= need
        for r in running:
            r[0], r[1] = r[0] + 1, r[1] + 1
        while waiting and _blocks(waiting[0][0], block) <= free:
            p, m = waiting.pop(0)
            free -= _blocks(p, block)
            running.append([p, 1, m])
        for r in [r for r in running if r[1] >= r[2]]:
            running.remove(r)
            free += _blocks(r[0], block)
    return None


def _engine_settings(rng: random.Random, preempts: bool | None) -> dict[str, Any]:
    """Prompt/output lengths and a small paged cache that holds each request, with the wanted behaviour:
    not everyone fits at once, and (preempts) a preemption happens, or (not preempts) never does."""
    while True:
        block = rng.choice([4, 8, 16])
        n = rng.randint(5, 8)
        prompts = [rng.randint(3, 40) for _ in range(n)]
        outputs = [rng.randint(2, 40) for _ in range(n)]
        biggest = max(-(-(p + o - 1) // block) for p, o in zip(prompts, outputs, strict=True))
        all_prompts = sum(-(-p // block) for p in prompts)
        num_blocks = rng.randint(biggest, max(biggest, all_prompts))
        if _admitted_at_once(prompts, num_blocks, block) == n or sum(prompts) > BLOCK_TOKENS:
            continue
        if (preempts is not None
                and (_first_preemption_step(prompts, outputs, num_blocks, block) is not None) != preempts):
            continue
        return {"prompt_lens": prompts, "output_lens": outputs, "num_blocks": num_blocks, "block_size": block,
                "seed": rng.randrange(10_000)}


def params(seed: int) -> dict[str, Any]:
    rng = random.Random(f"lab1_kv_calculator/{seed}")
    out: dict[str, Any] = {}

    # Part 1: one idea per list.
    out["hidden_mha"] = [_bytes_case(_dense(rng, "mha"), 2), _bytes_case(_dense(rng, "mha_no_key"), 2)]
    out["hidden_gqa"] = [_bytes_case(_dense(rng, "gqa"), 2), _bytes_case(_dense(rng, "gqa", True), 2),
                         _bytes_case(_dense(rng, "mqa"), 2)]
    out["hidden_head_dim"] = [_bytes_case(_dense(rng, "odd_head_dim"), 2) for _ in range(2)]
    out["hidden_dtype"] = [_bytes_case(_dense(rng, "mha"), 1), _bytes_case(_dense(rng, "mha_no_key"), 4)]

    # Part 2: whole batches, contexts that are not round numbers.
    out["hidden_cache"] = []
    for _ in range(3):
        config, nbytes = _dense(rng, rng.choice(["gqa", "mqa", "mha"])), rng.choice([1, 2])
        ctx, batch = rng.randint(1_000, 200_000), rng.randint(1, 64)
        out["hidden_cache"].append({"config": config, "context_len": ctx, "batch_size": batch,
                                    "nbytes": nbytes, "want": _per_token(config, nbytes) * ctx * batch})

    # Part 3: budget arithmetic (block multiples), paged rounding (not multiples), nothing left (0).
    def capacity(ctx_of: Any, small_gpu: bool = False) -> dict[str, Any]:
        while True:
            config = _dense(rng, rng.choice(["gqa", "mha"]))
            block = rng.choice([16, 32, 256])
            case = _capacity_case(rng, config, ctx_of(block), block, rng.choice([40, 48, 80, 94, 141]),
                                  rng.choice([1.5, 3.8, 7.2, 8.0, 13.0]), rng.choice([1, 2]),
                                  rng.choice([0.8, 0.85, 0.9, 0.92, 0.95]), rng.choice([1, 2, 3]))
            if case["want"] >= 2:
                return case

    out["hidden_budget"] = [capacity(lambda b: b * rng.randint(4, 400)) for _ in range(3)]
    out["hidden_paged"] = []
    while len(out["hidden_paged"]) < 3:  # the rounding must change the answer, or the case tests nothing
        case = capacity(lambda b: b * rng.randint(1, 300) + rng.randint(1, b - 1))
        unpaged = case["budget"] // (case["context_len"] * _per_token(case["config"],
                                                                      case["bytes_per_element"]))
        if unpaged != case["want"]:
            out["hidden_paged"].append(case)
    config = _dense(rng, "gqa")
    weights_gib = rng.choice([24, 40, 48])
    out["hidden_zero"] = [
        # the weights alone are bigger than the GPU
        _capacity_case(rng, config, 4_096, 16, weights_gib, rng.choice([30.0, 34.0]), 2, 0.9, 2),
        # the weights fit, but not with the utilization cap and the reserve: the budget is negative
        _capacity_case(rng, config, 2_048, 16, weights_gib, weights_gib * 0.95 * GiB / 1e9, 1, 0.9, 2),
    ]
    assert all(c["want"] == 0 and c["budget"] < 0 for c in out["hidden_zero"])

    # Part 4: the plot, with two unseen models at contexts of this course's choosing.
    names = rng.sample(["Orca-34B", "Heron-13B", "Kestrel-70B", "Wren-9B", "Osprey-22B", "Lark-8B"], 2)
    plot_models = {names[0]: _dense(rng, "gqa"), names[1]: _dense(rng, "mha")}
    contexts = sorted(rng.sample(range(1_000, 200_001, 500), 4))
    out["hidden_plot"] = {"models": plot_models, "contexts": contexts,
                          "want_gib": {n: [_per_token(c, 2) * x / GiB for x in contexts]
                                       for n, c in plot_models.items()}}

    # Part 5: the engine (the hidden test runs it; these are the settings).
    out["hidden_engine_admit"] = [_engine_settings(rng, None) for _ in range(2)]
    out["hidden_engine_preempt"] = [_engine_settings(rng, True), _engine_settings(rng, True),
                                    _engine_settings(rng, False)]

    # Part 6: sliding-window and hybrid models (no paging here: a layer keeps min(context, window) tokens).
    out["hidden_sliding"] = []
    for ctx_kind in ("short", "long", "long"):
        config, nbytes = _hybrid(rng), rng.choice([1, 2])
        window = config["sliding_window"]
        ctx = rng.randint(16, window - 1) if ctx_kind == "short" else rng.randint(window + 1, 100_000)
        spec = kvcalc.load_model_spec(config)
        want = kvcalc.kv_bytes_per_sequence(spec, ctx, kv_cache_dtype=KV_DTYPE[nbytes])
        out["hidden_sliding"].append({"config": config, "context_len": ctx, "nbytes": nbytes, "want": want})
    config = _dense(rng, "gqa")  # no layer_types, no window: every layer keeps everything
    out["hidden_sliding"].append({"config": config, "context_len": 12_345, "nbytes": 2,
                                  "want": _per_token(config, 2) * 12_345})

    # Part 7: MLA (one latent per layer, shared by every head; no separate K and V).
    out["hidden_mla"] = []
    for nbytes in (2, 1):
        config = _mla(rng)
        want = config["num_hidden_layers"] * (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * nbytes
        assert want == _per_token(config, nbytes)
        out["hidden_mla"].append({"config": config, "nbytes": nbytes, "want": want})

    # Part 8: tensor parallelism: heads split over ranks, or replicated when there are fewer heads than ranks.
    def tp_case(split: bool) -> dict[str, Any]:
        while True:
            config = _dense(rng, rng.choice(["gqa", "mha"] if split else ["gqa", "mqa"]))
            kv = config["num_key_value_heads"]
            tps = [t for t in (2, 4, 8, 16) if config["num_attention_heads"] % t == 0
                   and ((kv % t == 0) if split else (t > kv and t % kv == 0))]
            if tps:
                tp, nbytes = rng.choice(tps), rng.choice([1, 2])
                return {"config": config, "tp": tp, "nbytes": nbytes, "want": _per_token(config, nbytes, tp)}

    out["hidden_tp_split"] = [tp_case(True) for _ in range(2)]
    out["hidden_tp_replicated"] = [tp_case(False) for _ in range(2)]

    # Part 9: a capacity plan with Little's law.
    out["hidden_little"] = []
    while len(out["hidden_little"]) < 3:
        rate, ttft, tpot, n_out = rng.choice([0.5, 2, 3.5, 8, 20, 45]), rng.uniform(0.05, 2.0), \
            rng.uniform(0.008, 0.08), rng.randint(50, 1500)
        e2e = ttft + tpot * (n_out - 1)
        if 0.05 < (rate * e2e) % 1 < 0.95:
            out["hidden_little"].append({"arrival_rate": rate, "mean_ttft_s": round(ttft, 3),
                                         "mean_tpot_s": round(tpot, 4), "mean_output_tokens": n_out,
                                         "want": rate * (round(ttft, 3) + round(tpot, 4) * (n_out - 1))})
    out["hidden_gpus"] = []
    while len(out["hidden_gpus"]) < 3:
        concurrent = rng.uniform(5, 3_000)
        seq = rng.randint(50, 4_000) * 2**20
        budget = rng.choice([20, 40, 60, 100]) * GiB + rng.randint(0, 2**30)
        per_gpu = budget // seq
        if per_gpu >= 1 and math.ceil(concurrent / per_gpu) != math.ceil(concurrent * seq / budget):
            out["hidden_gpus"].append({"concurrent": round(concurrent, 2), "kv_bytes_per_sequence": seq,
                                       "kv_budget_per_gpu": budget,
                                       "want": math.ceil(math.ceil(round(concurrent, 2)) / per_gpu)})

    # Part 3, the other way round (drawn last, so the earlier parts' cases stay what they were): the
    # longest context each of N sequences can hold, where whole blocks change the answer, and one budget
    # too small to give every sequence a block.
    out["hidden_longest"] = []
    while len(out["hidden_longest"]) < 4:
        zero = len(out["hidden_longest"]) == 3
        config, nbytes = _dense(rng, rng.choice(["gqa", "mha", "mqa"])), rng.choice([1, 2])
        block = rng.choice([16, 32, 256])
        per_block = block * _per_token(config, nbytes)
        if zero:  # fewer blocks than sequences
            budget = rng.randint(1, 8) * per_block * 3
            num_seqs = rng.randint(budget // per_block + 1, 4 * (budget // per_block) + 8)
        else:
            budget = rng.randint(4, 120) * GiB + rng.randint(0, GiB)
            num_seqs = rng.randint(1, 512)
        want = budget // per_block // num_seqs * block
        unpaged = budget // (num_seqs * _per_token(config, nbytes))
        if (want == 0) == zero and unpaged != want:
            out["hidden_longest"].append({"config": config, "num_seqs": num_seqs, "kv_budget_bytes": budget,
                                          "nbytes": nbytes, "block_size": block, "want": want})
    return out
