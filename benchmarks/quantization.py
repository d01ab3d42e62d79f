"""Quantization, measured: bytes per decode step, the floor each format implies, and what it costs.

    .venv/bin/python benchmarks/quantization.py              # SmolLM2-135M, minengine + llama.cpp (if built)
    .venv/bin/python benchmarks/quantization.py --smoke      # the tiny shipped model, a few tokens (CI)

What is measured, and against what. SmolLM2-135M is installed only as its Q4_1 GGUF file, so the fp32
model minengine runs holds exactly the Q4_1 values: it is the **reference** (the original bf16 weights
are not available offline, so the cost of the Q4_1 step itself cannot be measured here). Against it:

- minengine, weights only (compute stays fp32; ``minengine/course/weight_quant.py``): the reference
  rounded to bf16; re-quantized to Q8_0 and Q4_0 with llama.cpp's recipes (byte-identical to
  ``llama-quantize``, checked below); Q4_0's recipe at 3 and 2 bits; and "Q4_1 as shipped", which must
  change nothing (the values are already Q4_1);
- minengine bf16: the engine run in bfloat16 (weights *and* activations), as a bf16 server runs;
- llama.cpp (built by ``benchmarks/llamacpp.py --build``): the shipped Q4_1 file, the f32/f16 files
  requantized from it, and Q8_0 / Q4_0 (Q8_0 embedding) files ``llama-quantize`` makes from the f32 one.
  Its quantized kernels also round the activations to 8 bits, a real difference from minengine's fake
  quantization.

Each row: bytes one batch-1 decode step reads (the tensors' real sizes), the floor they imply at this
machine's measured read bandwidth, the measured decode step (``--skip-timing`` to skip), perplexity on
``minengine/assets/heldout/prose.txt`` scored as ``llama-perplexity`` scores it (chunks of ``--n-ctx``
tokens, the second half of each), and greedy agreement with the reference over ``--prompts`` chat
prompts x ``--tokens`` tokens: the share of identical tokens, whole answers identical, and the median
position where answers part.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:
    from benchmarks import common, llamacpp
except ImportError:  # run as a script
    import common  # type: ignore[no-redef]
    import llamacpp  # type: ignore[no-redef]

MINENGINE_KEYS = ("fp32", "bf16", "Q8_0", "Q4_1", "Q4_0", "int3", "int2")
LLAMACPP_KINDS = ("f32", "f16", "q8_0", "q4_1", "q4_0")


def decode_ms(llm: Any, prompt: list[int], n_gen: int) -> float:
    """Median gap between one request's tokens (batch 1), from the engine's own stamps; one warm-up."""
    import minengine

    params = minengine.SamplingParams(max_tokens=n_gen, temperature=0.0, ignore_eos=True)
    for _ in range(2):
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    times = llm.request_records[-1].token_times
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False)) * 1e3


def minengine_rows(args: argparse.Namespace, bandwidth: float) -> tuple[dict[str, Any], list[list[int]], Any]:
    import minengine
    from minengine.course import quant_lesson as ql
    from minengine.course import weight_quant as wq

    llm = minengine.LLM(args.model, dtype="float32", enable_prefix_caching=False)
    tok = llm.get_tokenizer()
    prompts = ql.chat_prompt_ids(tok, ql.CHAT_PROMPTS[:args.prompts])
    text = ql.heldout_ids(args.model, tok)
    results = wq.compare_plans(llm, prompts, text, MINENGINE_KEYS, args.tokens, args.n_ctx, args.max_chunks,
                               progress=not args.smoke)
    reference = results[0].tokens
    same, total = wq.unchanged_by(llm, wq.PLANS["Q4_1"])
    print(f"storing minengine's fp32 weights as Q4_1 (embedding Q8_0) leaves {same} of {total} matrices "
          "unchanged")
    rows: dict[str, Any] = {"_unchanged_by_q4_1": f"{same} of {total} matrices"}
    for r in results:
        rows[f"minengine {r.plan.label}"] = {
            "engine": "minengine, weights only", "bytes": r.bytes_per_step, "ppl": r.perplexity,
            "token_share": r.agreement.token_share, "identical": r.agreement.identical,
            "median_first_diff": r.agreement.median_first_diff, "note": r.plan.note}
    if not args.skip_timing:
        rows["minengine fp32"]["decode_ms"] = decode_ms(llm, prompts[0], args.gen)
    del llm
    bf16 = minengine.LLM(args.model, dtype="bfloat16", enable_prefix_caching=False)
    agree = wq.agreement(reference, wq.greedy_tokens(bf16, prompts, args.tokens))
    row = {"engine": "minengine bf16 engine", "bytes": wq.weight_bytes(bf16, wq.PLANS["bf16"]),
           "ppl": wq.chunked_perplexity(bf16, text, args.n_ctx, args.max_chunks),
           "token_share": agree.token_share, "identical": agree.identical,
           "median_first_diff": agree.median_first_diff, "note": "weights and activations in bf16"}
    if not args.skip_timing:
        row["decode_ms"] = decode_ms(bf16, prompts[0], args.gen)
    rows["minengine bf16 (engine)"] = row
    for key, r in rows.items():
        if not key.startswith("_"):
            r["floor_ms"] = r["bytes"] / bandwidth * 1e3
    return rows, reference, (prompts, text)


# -------------------------------------------------------------------------------------------- llama.cpp
def llamacpp_files() -> dict[str, Path]:
    """The shipped Q4_1, f32/f16 from it (``llamacpp.gguf_files``), and Q8_0 / Q4_0 made from the f32 file."""
    files = llamacpp.gguf_files()
    for kind, extra in (("q8_0", []), ("q4_0", ["--token-embedding-type", "q8_0"])):
        out = llamacpp.OUT / f"smollm2-135m-{kind}.gguf"
        if not out.exists():
            subprocess.run([str(llamacpp.tool("llama-quantize")), *extra, str(files["f32"]), str(out),
                            kind.upper()],
                           check=True, capture_output=True)
        files[kind] = out
    return {k: files[k] for k in LLAMACPP_KINDS}


def perplexity_tool() -> Path:
    """``llama-perplexity``, built from the same cmake tree as the other tools (about a minute, once)."""
    path = llamacpp.tool("llama-perplexity")
    if not path.exists():
        subprocess.run(["cmake", "--build", str(llamacpp.BUILD), "--target", "llama-perplexity"], check=True,
                       capture_output=True)
    return path


def llamacpp_perplexity(path: Path, text_file: Path, threads: int, n_ctx: int,
                        max_chunks: int | None) -> float:
    cmd = [str(perplexity_tool()), "-m", str(path), "-f", str(text_file), "-c", str(n_ctx), "-b", str(n_ctx),
           "-t", str(threads)]
    if max_chunks:
        cmd += ["--chunks", str(max_chunks)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+)", run.stdout + run.stderr)
    if not m:
        raise RuntimeError(f"llama-perplexity printed no estimate:\n{run.stderr[-2000:]}")
    return float(m.group(1))


def llamacpp_greedy(path: Path, prompts: list[list[int]], n: int, threads: int) -> list[list[int]]:
    """Greedy tokens from ``llama-server``'s /completion, fed the very prompt token ids minengine gets."""
    import httpx

    port = llamacpp._free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(llamacpp.tool("llama-server")), "-m", str(path), "-t", str(threads), "--parallel", "1",
           "-c", "2048", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]
    log = (llamacpp.OUT / f"quant-server-{port}.log").open("wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        llamacpp._wait_up(url, proc)
        body = {"n_predict": n, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
                "return_tokens": True}
        return [httpx.post(url + "/completion", json={**body, "prompt": p}, timeout=300).json()["tokens"]
                for p in prompts]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def same_bytes_as_llama_quantize(files: dict[str, Path]) -> dict[str, str]:
    """Quantize the f32 file's matrices with ``gguf.quantize_blocks``; compare with llama-quantize's bytes."""
    import numpy as np
    from gguf import GGUFReader

    from minengine.models.gguf import quantize_blocks

    f32 = {t.name: t for t in GGUFReader(str(files["f32"])).tensors}
    out = {}
    for kind in ("q8_0", "q4_0"):
        same = total = 0
        for t in GGUFReader(str(files[kind])).tensors:
            if t.tensor_type.name in ("Q8_0", "Q4_0"):
                total += 1
                same += np.array_equal(quantize_blocks(np.asarray(f32[t.name].data), t.tensor_type.name),
                                       np.asarray(t.data).view(np.uint8).reshape(-1))
        out[kind] = f"{same} of {total} tensors byte-identical"
    return out


def llamacpp_rows(args: argparse.Namespace, bandwidth: float, reference: list[list[int]],
                  prompts: list[list[int]]) -> dict[str, Any]:
    from minengine.course import weight_quant as wq
    from minengine.course.quant_lesson import HELDOUT_PROSE

    files = llamacpp_files()
    rows: dict[str, Any] = {"_check": same_bytes_as_llama_quantize(files)}
    threads = args.quality_threads or args.threads
    for kind, path in files.items():
        agree = wq.agreement(reference, llamacpp_greedy(path, prompts, args.tokens, threads))
        row = {"engine": "llama.cpp", "bytes": llamacpp.tensor_bytes(path),
               "ppl": llamacpp_perplexity(path, HELDOUT_PROSE, threads, args.n_ctx, args.max_chunks),
               "token_share": agree.token_share, "identical": agree.identical,
               "median_first_diff": agree.median_first_diff, "note": path.name}
        row["floor_ms"] = row["bytes"] / bandwidth * 1e3
        if not args.skip_timing:
            row["decode_ms"] = 1e3 / llamacpp.llama_bench(path, args.threads, args.gen,
                                                          args.reps)["decode_tok_s"]
        rows[f"llama.cpp {kind.upper()}" + (" (as shipped)" if kind == "q4_1" else "")] = row
    return rows


def print_table(results: dict[str, Any]) -> None:
    ref = results["rows"]["minengine fp32"]["ppl"]
    print(f"\n{'variant':30s} {'MB/step':>8s} {'floor ms':>9s} {'decode ms':>10s} {'ppl':>9s} "
          f"{'vs fp32':>8s} {'tokens same':>12s} {'answers same':>13s} {'1st diff':>9s}")
    n = results["prompts"]
    for key, r in results["rows"].items():
        if key.startswith("_"):
            continue
        dec = f"{r['decode_ms']:10.1f}" if "decode_ms" in r else f"{'-':>10s}"
        print(f"{key:30s} {r['bytes'] / 1e6:8.1f} {r['floor_ms']:9.2f} {dec} {r['ppl']:9.3f} "
              f"{100 * (r['ppl'] / ref - 1):+7.2f}% {100 * r['token_share']:11.1f}% {r['identical']:>7d} of "
              f"{n:<3d} {r['median_first_diff']:9.0f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=10, help="chat prompts for greedy agreement (at most 10)")
    ap.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    ap.add_argument("--n-ctx", type=int, default=512, help="perplexity chunk length (llama-perplexity's -c)")
    ap.add_argument("--max-chunks", type=int, default=None,
                    help="perplexity chunks (default: the whole text)")
    ap.add_argument("--gen", type=int, default=64, help="decode tokens per timing")
    ap.add_argument("--reps", type=int, default=3, help="llama-bench repetitions")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--quality-threads", type=int, default=None,
                    help="llama.cpp threads for perplexity and greedy runs (default --threads; 1 on a busy "
                         "machine: spinning worker threads slow llama.cpp down many times when cores are "
                         "shared)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="the tiny shipped model, 2 prompts x 8 tokens, no llama.cpp")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.prompts, args.tokens, args.n_ctx, args.max_chunks = "tinystories-4m", 2, 8, 128, 2
        args.gen, args.skip_llamacpp = 8, True
    from minengine.perf.measure import measure_read_bandwidth

    common.set_threads(args.threads)
    print(common.machine_line())
    bandwidth = measure_read_bandwidth("cpu")
    print(f"read bandwidth: {bandwidth / 1e9:.1f} GB/s; model {args.model}; {args.prompts} chat prompts x "
          f"{args.tokens} greedy tokens; perplexity in chunks of {args.n_ctx} (second halves scored)")
    start = time.perf_counter()
    rows, reference, (prompts, _text) = minengine_rows(args, bandwidth)
    results: dict[str, Any] = {"machine": common.machine_line(), "command": common.command_line(),
                               "bandwidth_gb_s": bandwidth / 1e9, "model": args.model,
                               "prompts": len(prompts), "tokens": args.tokens, "n_ctx": args.n_ctx,
                               "unchanged_by_q4_1": rows.pop("_unchanged_by_q4_1"), "rows": rows}
    if args.json:  # the minengine half now, in case the llama.cpp half is interrupted
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    if not args.skip_llamacpp:
        if args.model != "smollm2-135m" or not llamacpp.have_tools():
            print(f"llama.cpp rows skipped: they need smollm2-135m and the tools under {llamacpp.BUILD} "
                  "(benchmarks/llamacpp.py --build)", file=sys.stderr)
        else:
            results["llama.cpp"] = llamacpp.llamacpp_version()
            cpp = llamacpp_rows(args, bandwidth, reference, prompts)
            results["quantizer_check"] = cpp.pop("_check")
            rows.update(cpp)
    print_table(results)
    if "quantizer_check" in results:
        print("gguf.quantize_blocks vs llama-quantize:",
              ", ".join(f"{k.upper()} {v}" for k, v in results["quantizer_check"].items()))
    print(f"({time.perf_counter() - start:.0f} s)")
    common.save_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
