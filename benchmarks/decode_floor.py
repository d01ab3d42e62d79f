"""Batch-1 decode step time against the memory-bandwidth floor, minengine and HF ``generate()`` side by side.

    .venv/bin/python benchmarks/decode_floor.py                       # llama-100m, fp32 and bf16
    .venv/bin/python benchmarks/decode_floor.py --dtypes float32 --rounds 3
    .venv/bin/python benchmarks/decode_floor.py --dtypes float32 --breakdown   # + where the time goes
    .venv/bin/python benchmarks/decode_floor.py --dtypes float32 --breakdown --overhead --threads 1
        # the same variants with the GEMVs' arithmetic taken out: the small ops alone, little bandwidth noise
    .venv/bin/python benchmarks/decode_floor.py --smoke               # seconds; for the CI test
    .venv/bin/python benchmarks/decode_floor.py --no-compile          # without the compiled-decode engine

Why a floor: at batch 1 every decode step must read every weight once (and the KV cache), and a CPU can
read memory only so fast. ``floor = bytes read per step / read bandwidth``, with the bandwidth measured in
the same run, just before each round, on a buffer as large as the weights (a ``sum``, like
``minengine.perf.measure``). No engine can beat it; the ratio step / floor says how much time goes to
everything else (Python, small ops, attention, sampling).

Step time: the gap between consecutive output tokens of one request (its ITL), for minengine from the
engine's own token stamps and for HF from a ``StoppingCriteria`` that HF calls once per generated token.
The prefill (first token) is left out. Engines run interleaved, round by round, so load drift hits both.
A third engine is minengine with ``compile_decode=True`` (its decode steps one ``torch.compile``'d graph,
compiled once before the rounds), checked to give the eager engine's greedy tokens.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from tqdm.auto import tqdm

import minengine
from minengine import kvcalc
from minengine.perf.measure import measure_read_bandwidth

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/decode_floor.py
    import common  # type: ignore[no-redef]


class _TokenClock:
    """A StoppingCriteria that never stops, only stamps the time HF finishes each token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def run_dtype(shape: str, dtype: str, args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    from transformers import StoppingCriteriaList

    path = common.model_dir(shape, dtype)
    llm = minengine.LLM(str(path), dtype=dtype, enable_prefix_caching=False, max_num_seqs=4,
                        num_blocks=(args.prompt_len + args.new_tokens) // 16 + 8)
    hf = common.load_hf(path, dtype)
    weights = common.weight_bytes(llm.llm_engine.model)
    kv_tok = kvcalc.kv_bytes_per_token(hf.config, kv_cache_dtype=dtype)  # GQA aware (REFERENCE.md)
    mean_ctx = args.prompt_len + args.new_tokens / 2
    bytes_per_step = weights + kv_tok * (mean_ctx + 1)  # weights + read the context + write one token
    bw_bytes = max(2**28, weights)
    prompt = [(37 * j) % 1000 + 3 for j in range(args.prompt_len)]
    params = minengine.SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    ids = torch.tensor([prompt])

    def mine() -> list[float]:
        llm.generate([prompt], params, use_tqdm=False)
        return _gaps(llm.request_records[0].token_times)

    compiled, compile_s = None, None
    if args.compile and dtype == "float32":  # the same engine, its decode steps compiled (fp32 only)
        compiled = minengine.LLM(str(path), dtype=dtype, enable_prefix_caching=False, max_num_seqs=4,
                                 num_blocks=(args.prompt_len + args.new_tokens) // 16 + 8,
                                 compile_decode=True)
        compile_s = compiled.llm_engine.model_runner.compiled_decode.compile_seconds

    def mine_compiled() -> list[float]:
        assert compiled is not None
        out = compiled.generate([prompt], params, use_tqdm=False)
        if out[0].outputs[0].token_ids != reference_tokens:
            raise RuntimeError("the compiled decode steps gave other greedy tokens than the eager engine")
        return _gaps(compiled.request_records[0].token_times)

    linears = [m for m in llm.llm_engine.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = {n: torch.randn(1, n, dtype=getattr(torch, dtype)) for n in {m.in_features for m in linears}}

    def matmuls_only() -> float:
        """The step's weight matmuls back to back, nothing else: what the kernels alone reach."""
        times = []
        with torch.inference_mode():
            for _ in range(3):
                start = time.perf_counter()
                for m in linears:
                    m(inputs[m.in_features])
                times.append(time.perf_counter() - start)
        return common.median(times)

    def theirs() -> list[float]:
        clock = _TokenClock()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                        min_new_tokens=args.new_tokens, do_sample=False,
                        stopping_criteria=StoppingCriteriaList([clock]), pad_token_id=0)
        return _gaps(clock.times)

    mine(), theirs()  # warm-up: first calls allocate and pick kernels
    reference_tokens = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    if compiled is not None:
        mine_compiled()
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        bw = measure_read_bandwidth("cpu", num_bytes=bw_bytes, repeats=5)
        floor = bytes_per_step / bw
        row: dict[str, Any] = {"bandwidth": bw, "floor": floor, "load": common.loadavg()[0],
                               "matmuls": matmuls_only()}
        pair = [("minengine", mine), ("hf", theirs)] + ([("compiled", mine_compiled)] if compiled else [])
        for name, fn in pair if r % 2 == 0 else pair[::-1]:
            gaps = fn()
            row[name] = common.median(gaps)
            row[name + "_gaps"] = gaps
            bar.update(1)
        rounds.append(row)

    def med(key: str) -> float:
        return common.median([r[key] for r in rounds])

    parts = breakdown(mine, args.rounds, args.overhead) if args.breakdown else None
    return {
        "breakdown": parts,
        "shape": shape, "dtype": dtype, "params": common.num_params(hf), "weight_bytes": weights,
        "bytes_per_step": bytes_per_step, "bandwidth": med("bandwidth"), "floor": med("floor"),
        "matmuls": med("matmuls"),
        "minengine": med("minengine"), "hf": med("hf"),
        "minengine_ratio": common.median([r["minengine"] / r["floor"] for r in rounds]),
        "compiled": med("compiled") if compiled else None, "compile_seconds": compile_s,
        "compiled_ratio": common.median([r["compiled"] / r["floor"] for r in rounds]) if compiled else None,
        "hf_ratio": common.median([r["hf"] / r["floor"] for r in rounds]),
        "loads": [r["load"] for r in rounds],
        "rounds": [{k: v for k, v in r.items() if not k.endswith("_gaps")} for r in rounds],
    }


def breakdown(mine: Any, rounds: int, overhead: bool = False) -> dict[str, float]:
    """Median ITL with one part of every layer changed: what each hot-path change saved, and where the
    time beyond the matmuls goes. Variants run interleaved in this one process (paired A/B).

    "(before)" variants put back how the code ran before the hot-path work (issue 13) on the same weights:
    q/k/v and gate/up as separate GEMVs on row views of the fused matrices (plus one ``cat``, so the
    saving is slightly overstated), RMSNorm as its six textbook ops. The "skipped" variants compute wrong
    tokens; their saving is an upper bound on what a faster version of that part could save.
    With ``overhead`` every Linear kernel returns a preallocated output of the right shape instead of
    computing it: what is left is the step without the weight GEMVs' arithmetic (a probe, wrong tokens),
    where a few microseconds per small op show above the noise of a shared machine's memory bandwidth.
    Patches ``minengine.models.llama`` (and the Linear kernels) for the duration (restored after).
    """
    import torch.nn.functional as F

    from minengine.models import llama

    names = ("attention_forward", "RMSNorm.forward", "RotaryEmbedding.forward", "LlamaAttention.forward",
             "LlamaMLP.forward", "LlamaModel.forward")

    def get(name: str) -> Any:
        obj, _, attr = name.rpartition(".")
        return getattr(getattr(llama, obj) if obj else llama, attr)

    def put(name: str, value: Any) -> None:
        obj, _, attr = name.rpartition(".")
        setattr(getattr(llama, obj) if obj else llama, attr, value)

    shipped = {name: get(name) for name in names}

    def textbook_rms(self: Any, x: torch.Tensor) -> torch.Tensor:
        dtype, x = x.dtype, x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                              + self.variance_epsilon)).to(dtype)

    def torch_rms(self: Any, x: torch.Tensor) -> torch.Tensor:  # ~7 ATen ops on a CPU (llama.RMSNorm's doc)
        if x.dtype != torch.float32:
            return shipped["RMSNorm.forward"](self, x)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.variance_epsilon)

    def linear(module: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """What ``module`` (a fused Linear) would run for x, on the rows ``w`` of its matrix."""
        return module.run(x, w, b) if hasattr(module, "run") else F.linear(x, w, b)  # KernelLinear.run

    def unfused_attention(self: Any, x: torch.Tensor, rope: Any, rotary_emb: Any, meta: Any,
                          cache: Any) -> Any:
        w, b = self.qkv_proj.weight, self.qkv_proj.bias
        cuts = (0, self.q_size, self.q_size + self.kv_size, self.q_size + 2 * self.kv_size)
        q, k, v = (linear(self.qkv_proj, x, w[i:j], None if b is None else b[i:j])
                   for i, j in zip(cuts, cuts[1:], strict=False))
        n = x.shape[0]
        qk = torch.cat((q, k), -1).view(n, self.num_heads + self.num_kv_heads, self.head_dim)
        q, k = rotary_emb(rope, qk, self.num_heads)
        out = llama.attention_forward(q, k, v.view(n, self.num_kv_heads, self.head_dim), cache, meta,
                                      self.scaling, self.sliding_window)
        return self.o_proj(out.reshape(n, -1))

    def unfused_mlp(self: Any, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gate_up_proj.weight, self.gate_up_proj.bias
        half = w.shape[0] // 2
        gate = linear(self.gate_up_proj, x, w[:half], None if b is None else b[:half])
        up = linear(self.gate_up_proj, x, w[half:], None if b is None else b[half:])
        return self.down_proj(F.silu(gate) * up)

    def per_layer_rope_model(self: Any, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any,
                             kv_caches: Any = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        meta.prepare(x.device, self.sliding_windows)
        for i, layer in enumerate(self.layers):  # the positions go to every layer, which looks cos/sin up
            x = layer(x, positions, self.rotary_emb, meta, kv_caches[i] if kv_caches is not None else None)
        return self.norm(x)

    def per_layer_rope(self: Any, positions: torch.Tensor, qk: torch.Tensor, n: int) -> Any:
        q, k = qk.split((n, qk.shape[1] - n), 1)
        cos = self.cos_cached[positions].to(q.dtype).unsqueeze(1)
        sin = self.sin_cached[positions].to(q.dtype).unsqueeze(1)

        def rotate(x: torch.Tensor) -> torch.Tensor:  # the old rotation, q and k apart (7 ops each)
            x1, x2 = x.chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

        return rotate(q), rotate(k)

    def torch_rope(self: Any, tables: Any, qk: torch.Tensor, n: int) -> Any:  # 4 ops (RotaryEmbedding's doc)
        cos, sin = tables
        x1, x2 = qk.chunk(2, -1)
        return (qk * cos + torch.cat((x2, x1), -1) * sin).split((n, qk.shape[1] - n), 1)

    variants: dict[str, dict[str, Any]] = {
        "as shipped": {},
        "q/k/v and gate/up as 5 GEMVs (before)": {"LlamaAttention.forward": unfused_attention,
                                                  "LlamaMLP.forward": unfused_mlp},
        "RMSNorm as 6 ops (before)": {"RMSNorm.forward": textbook_rms},
        "RMSNorm as F.rms_norm, not the C++ call (before)": {"RMSNorm.forward": torch_rms},
        "RoPE as 4 ops, not the C++ call (before)": {"RotaryEmbedding.forward": torch_rope},
        "RoPE looked up per layer, q and k apart (before)": {"LlamaModel.forward": per_layer_rope_model,
                                                            "RotaryEmbedding.forward": per_layer_rope},
        "attention skipped": {"attention_forward": lambda q, *a, **k: q},
        "RoPE skipped": {"RotaryEmbedding.forward":
                         lambda self, tables, qk, n: qk.split((n, qk.shape[1] - n), 1)},
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    real_linear, outputs = F.linear, {}

    def no_arithmetic(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        key = (tuple(x.shape[:-1]), w.shape[0], x.dtype)
        if key not in outputs:
            outputs[key] = 0.1 * torch.randn(*x.shape[:-1], w.shape[0], dtype=x.dtype)
        return outputs[key]

    from minengine.models import linear_kernels

    kernels = {name: getattr(linear_kernels, name) for name in ("_gemv", "onednn_linear")}
    if overhead:  # every Linear kernel the engine may call: F.linear, the GEMV, oneDNN
        F.linear = no_arithmetic
        for name in kernels:
            setattr(linear_kernels, name, no_arithmetic)
    try:
        for r in range(rounds):
            for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                for part, fn in {**shipped, **variants[name]}.items():
                    put(part, fn)
                times[name].append(common.median(mine()))
    finally:
        F.linear = real_linear
        for name, fn in kernels.items():
            setattr(linear_kernels, name, fn)
        for part, fn in shipped.items():
            put(part, fn)
    return {name: common.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-100m", choices=sorted(common.SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64, help="generated tokens per request")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per dtype")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time minengine with parts put back as they were before issue 13, or removed")
    ap.add_argument("--overhead", action="store_true",
                    help="with --breakdown: take the GEMVs' arithmetic out (a probe of the small ops alone)")
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="skip the engine with compile_decode=True (it compiles for tens of seconds first)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 round (for the CI test)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.dtypes, args.new_tokens, args.rounds = "llama-tiny", "float32", 8, 1
        args.compile = False
    common.set_threads(args.threads)
    dtypes = args.dtypes.split(",")
    print(common.machine_line())
    results = []
    engines = sum(3 if args.compile and d == "float32" else 2 for d in dtypes)
    with tqdm(total=engines * args.rounds, desc="decode rounds", dynamic_ncols=True) as bar:
        for dtype in dtypes:
            results.append(run_dtype(args.shape, dtype, args, bar))
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    print(f"batch 1, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, {args.rounds} rounds; "
          "times are medians of per-round medians\n")
    rows = []
    for r in results:
        rows.append([
            f"{r['shape']} {r['dtype']}", f"{r['params'] / 1e6:.1f}M", f"{r['bytes_per_step'] / 1e6:.0f} MB",
            f"{r['bandwidth'] / 1e9:.1f} GB/s", f"{1e3 * r['floor']:.2f}", f"{1e3 * r['matmuls']:.2f}",
            f"{1e3 * r['minengine']:.2f}", f"**{r['minengine_ratio']:.2f}x**",
            f"{1e3 * r['hf']:.2f}", f"{r['hf_ratio']:.2f}x", f"{r['hf'] / r['minengine']:.2f}x",
            f"{1e3 * r['compiled']:.2f}" if r["compiled"] else "-",
            f"**{r['compiled_ratio']:.2f}x**" if r["compiled"] else "-",
            " ".join(f"{x:.2f}" for x in r["loads"]),
        ])
    print(common.md_table(
        ["model", "params", "bytes/step", "read BW", "floor ms", "matmuls alone ms", "minengine ms",
         "minengine / floor", "HF generate ms", "HF / floor", "HF / minengine", "compiled ms",
         "compiled / floor", "load avg per round"], rows))
    for r in results:
        if r["compiled"]:
            print(f"compiled decode ({r['dtype']}): compiled at start-up in {r['compile_seconds']:.1f} s, "
                  f"same greedy tokens as the eager engine, {r['minengine'] / r['compiled']:.2f}x faster per "
                  "token")
    for r in results:
        if r["breakdown"]:
            base = r["breakdown"]["as shipped"]
            if args.overhead:
                print("\n(--overhead: every weight GEMV's arithmetic taken out: these are the steps' small "
                      "ops alone)")
            print(f"\nWhat each change saved, and where minengine's {r['dtype']} step goes beyond the "
                  f"matmuls ({1e3 * r['matmuls']:.2f} ms alone): a '(before)' variant's difference is what "
                  "that change saved; a 'skipped' part's (negative) is at most what a faster version could "
                  "save (its tokens are wrong):\n")
            print(common.md_table(["variant", "minengine ms", "variant - shipped ms"], [
                [name, f"{1e3 * t:.2f}", f"{1e3 * (t - base):+.2f}"] for name, t in r["breakdown"].items()]))
    common.save_json(args.json, {"results": results})
    return results


if __name__ == "__main__":
    main()
