"""Batched throughput against the compute floor: llama.cpp's ``llama-batched-bench`` and minengine on the
same weights and the same workload, each as a multiple of the floor measured in the same run.

    .venv/bin/python benchmarks/batched_yardstick.py                 # 64 x (256 prompt + 128 new), ~3 min
    .venv/bin/python benchmarks/batched_yardstick.py --rounds 3 --json benchmarks/out/final/yardstick.json
    .venv/bin/python benchmarks/batched_yardstick.py --smoke         # minengine's side, seconds (CI)

Why: ``throughput.py`` holds minengine to "wall time <= 1.4x the compute floor" (the workload's FLOPs over
the measured fp32 matmul peak). Whether that is within reach of a CPU engine on this machine is a question
for a second engine. llama.cpp is the CPU yardstick (``llamacpp.py``); its ``llama-batched-bench`` runs B
sequences of P random prompt tokens at once (the prompts first, in ubatches of 512 tokens), then G decode
steps of B rows, and times both phases. minengine runs the same shape on the same SmolLM2-135M weights
(the packaged Q4_1 file dequantized to fp32, as ``llamacpp.py`` does; llama.cpp reads the f32 file
requantized from it):

- ``minengine prefill-first``: every prompt before any decode, in 512-token steps: llama-batched-bench's
  order, so the two phases compare one to one;
- ``minengine decode-first``: the engine's default policy (each step's decodes first, prompt chunks in
  the rest of its 512-token budget), as ``throughput.py`` runs it.

Each request computes P + G tokens and G + 1 rows of logits (the prompt's last token and the G decode
steps), in both engines. The floor counts that arithmetic (``mixed_workload.workload_flops``) and divides
it by the fp32 matmul peak (``minengine.perf.measure``, read before each round; the highest reading of the
run is used, since load on a shared machine only lowers a reading). The prompt phase's floor is its share
of the FLOPs; the decode phase's is the larger of its share and its read (every weight and every row's K/V
once a step, over the best read bandwidth of the run), since a decode step of B rows may be memory-bound.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from typing import Any

from minengine.utils import cdiv

try:
    from benchmarks import common, llamacpp, mixed_workload
except ImportError:  # run as a script: python benchmarks/batched_yardstick.py
    import common  # type: ignore[no-redef]
    import llamacpp  # type: ignore[no-redef]
    import mixed_workload  # type: ignore[no-redef]

UBATCH = 512  # llama.cpp's default ubatch, and minengine's per-step token budget here


def phase_flops(config: Any, batch: int, prompt: int, gen: int) -> tuple[float, float]:
    """(prompt phase, decode phase) FLOPs: B prompts of P tokens with the last one's logits, then G steps
    of B rows each. Their sum is ``workload_flops`` of B requests of P prompt and G + 1 output tokens."""
    linear, q, _, head = mixed_workload.per_token_shape(config)
    per_pair = config.num_hidden_layers * 4 * q
    prefill = batch * (2 * linear * prompt + per_pair * prompt * (prompt + 1) / 2 + 2 * head)
    decode = batch * sum(2 * linear + per_pair * (prompt + t + 1) + 2 * head for t in range(gen))
    return prefill, decode


def decode_read_bytes(config: Any, batch: int, prompt: int, gen: int, weight_bytes: int) -> float:
    """Bytes the decode phase must read at the least: every weight once a step, every row's K/V (fp32)."""
    _, _, kv, _ = mixed_workload.per_token_shape(config)
    per_token = 2 * kv * config.num_hidden_layers * 4
    return gen * weight_bytes + batch * per_token * sum(prompt + t + 1 for t in range(gen))


def run_llamacpp(threads: int, batch: int, prompt: int, gen: int) -> dict[str, float]:
    """One llama-batched-bench run on the f32 file: its own timers for the two phases."""
    path = llamacpp.gguf_files()["f32"]
    cmd = [str(llamacpp.tool("llama-batched-bench")), "-m", str(path), "-t", str(threads),
           "-c", str(batch * (prompt + gen) + 256), "-b", "2048", "-ub", str(UBATCH),
           "-npp", str(prompt), "-ntg", str(gen), "-npl", str(batch), "--output-format", "jsonl"]
    run = subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in (run.stdout + run.stderr).splitlines()
            if line.startswith('{"n_kv_max"')]
    if len(rows) != 1:
        raise RuntimeError(f"llama-batched-bench printed {len(rows)} result rows:\n"
                           f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
    row = rows[0]
    return {"prefill_s": row["t_pp"], "decode_s": row["t_tg"], "wall_s": row["t"]}


def make_minengine(policy: str, batch: int, prompt: int, gen: int) -> Any:
    import minengine

    return minengine.LLM(llamacpp.MODEL, dtype="float32", policy=policy, enable_prefix_caching=False,
                         enable_chunked_prefill=True, max_num_batched_tokens=UBATCH, max_num_seqs=batch,
                         max_model_len=prompt + gen + 8, num_blocks=batch * cdiv(prompt + gen + 8, 16) + 16)


def run_minengine(llm: Any, batch: int, prompt: int, gen: int, seed: int) -> dict[str, float]:
    """B requests of P random prompt tokens and G + 1 output tokens (the first from the prompt's step)."""
    import minengine

    vocab = llm.llm_engine.model_config.vocab_size
    work = mixed_workload.make_workload(batch, (prompt, prompt), (gen + 1, gen + 1), vocab, seed)
    params = minengine.SamplingParams(temperature=0, max_tokens=gen + 1, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([p for p, _ in work], params, use_tqdm=False)
    wall = time.perf_counter() - start
    if any(len(o.outputs[0].token_ids) != gen + 1 for o in outs):
        raise RuntimeError("a request did not generate all its tokens")
    steps = [s for s in llm.step_records if s.start >= start]
    prefill = [s for s in steps if s.num_prefill_tokens > 0]
    return {"wall_s": wall, "prefill_s": sum(s.duration for s in prefill),
            "decode_s": sum(s.duration for s in steps if s.num_prefill_tokens == 0),
            "prefill_steps": len(prefill), "decode_steps": len(steps) - len(prefill)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=64, help="sequences at once (llama-batched-bench -npl)")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per sequence (-npp)")
    ap.add_argument("--gen", type=int, default=128, help="decode steps after the prompts (-ntg)")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians are reported)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="minengine only, 4 x (16 + 4): seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batch, args.prompt, args.gen, args.rounds = 4, 16, 4, 1
    from minengine.engine.threads import set_torch_threads
    from minengine.perf.measure import measure_matmul_flops, measure_read_bandwidth

    set_torch_threads(args.threads)
    print(f"command: {common.command_line()}")
    print(common.machine_line(llamacpp.SMOLLM2_LARGEST))
    have_llamacpp = not args.smoke and llamacpp.tool("llama-batched-bench").exists()
    if not args.smoke and not have_llamacpp:
        print("llama-batched-bench missing: run benchmarks/llamacpp.py --build (minengine's side only)")
    engines = {name: make_minengine(policy, args.batch, args.prompt, args.gen)
               for name, policy in (("minengine prefill-first", "prefill_first"),
                                    ("minengine decode-first", "decode_first"))}
    config = next(iter(engines.values())).llm_engine.model_config
    weights = common.weight_bytes(next(iter(engines.values())).llm_engine.model)
    for llm in engines.values():  # warm-up: oneDNN's first calls, the allocator
        run_minengine(llm, 2, 16, 4, seed=99)
    flops = phase_flops(config, args.batch, args.prompt, args.gen)
    read = decode_read_bytes(config, args.batch, args.prompt, args.gen, weights)
    runs: dict[str, list[dict[str, float]]] = {}
    peaks, bandwidths = [], []
    for r in range(args.rounds):
        peaks.append(measure_matmul_flops("cpu"))
        bandwidths.append(measure_read_bandwidth("cpu"))
        order = (["llama.cpp f32"] if have_llamacpp else []) + list(engines)
        for name in order if r % 2 == 0 else order[::-1]:
            res = (run_llamacpp(args.threads, args.batch, args.prompt, args.gen) if name == "llama.cpp f32"
                   else run_minengine(engines[name], args.batch, args.prompt, args.gen, seed=r))
            runs.setdefault(name, []).append(res)
    peaks.append(measure_matmul_flops("cpu"))  # once more after the last round: a smoke run has one round
    bandwidths.append(measure_read_bandwidth("cpu"))
    # The floors use the highest peak and bandwidth measured in the run, not each round's own: a reading
    # taken during a burst of load on this VM once came out at 286 GFLOP/s between two of 441-475, and
    # that round's ratios read 1.24-1.46x where the others read 1.88-2.15x (2026-12-02 22:18).
    peak, bandwidth = max(peaks), max(bandwidths)
    floors = {"wall_s": sum(flops) / peak, "prefill_s": flops[0] / peak,
              "decode_s": max(flops[1] / peak, read / bandwidth)}
    for results in runs.values():
        for res in results:
            res.update({f"{k} / floor": res[k] / floors[k] for k in floors})
    rows, summary = [], {}
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0]}
        summary[name] = med
        phases = [f"{med[k]:.2f} ({med[k + ' / floor']:.2f}x)" for k in ("prefill_s", "decode_s")]
        if name == "minengine decode-first":  # prompt chunks and decodes share steps: no clean phases
            phases = [f"{med['prefill_s']:.2f} (with decodes)", f"{med['decode_s']:.2f} (the rest)"]
        rows.append([name, f"{med['wall_s']:.2f}", f"**{med['wall_s / floor']:.2f}x**", *phases,
                     f"{args.batch * args.gen / med['decode_s']:.0f}" if name != "minengine decode-first"
                     else "-"])
    print(f"\nSmolLM2-135M fp32, {args.batch} sequences x ({args.prompt} prompt + {args.gen} decode steps), "
          f"{args.threads} threads, medians of {args.rounds} round(s); FLOPs {flops[0] / 1e12:.2f} + "
          f"{flops[1] / 1e12:.2f} T (prompts + decode); floors at the run's best matmul peak "
          f"{peak / 1e9:.0f} GFLOP/s ({', '.join(f'{p / 1e9:.0f}' for p in peaks)}) and read "
          f"{bandwidth / 1e9:.1f} GB/s ({', '.join(f'{b / 1e9:.1f}' for b in bandwidths)}): "
          f"{floors['wall_s']:.2f} s, {floors['prefill_s']:.2f} s, {floors['decode_s']:.2f} s\n")
    print(common.md_table(["engine", "wall s", "wall / compute floor", "prompt phase s (/ floor)",
                           "decode phase s (/ its floor)", "decode tok/s"], rows))
    result = {"args": vars(args), "flops": flops, "decode_read_bytes": read, "peaks": peaks,
              "bandwidths": bandwidths, "floors": floors, "runs": runs, "summary": summary}
    common.save_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
