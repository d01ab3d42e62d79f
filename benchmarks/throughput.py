"""Throughput on a mixed offline workload: minengine's schedulers against three ways of using transformers.

    .venv/bin/python benchmarks/throughput.py                     # 64 requests, llama-12m, fp32
    .venv/bin/python benchmarks/throughput.py --num-requests 32 --engines minengine-decode-first,hf-cb
    .venv/bin/python benchmarks/throughput.py --smoke

~6.5 minutes on the 2-core CPU of RESULTS.md with 2 threads; ``--rounds 1`` halves it.

The workload is nano-vllm's benchmark scaled to a 2-core CPU: N requests, prompt lengths uniform in
[16, 512], output lengths uniform in [16, 256], random token ids, greedy, ``ignore_eos`` (every request
generates exactly its output length), all sent at time 0 (``mixed_workload.py``: the workload and its
floors). Engines, all on the same weights:

- ``minengine-*``: ``LLM.generate`` with decode-first or prefill-first scheduling, chunked prefill on
  (token budget ``--chunk``) or off (budget = ``max_model_len``);
- ``hf-sequential``: ``model.generate()`` one request at a time (what a naive server does);
- ``hf-static``: ``model.generate()`` on left-padded batches of ``--static-batch`` requests in arrival
  order; a batch runs until its longest request is done (the padding and the idle tails are the waste
  that continuous batching removes);
- ``hf-cb``: transformers' own continuous batching (the manager behind ``generate_batch``, driven through
  ``init_continuous_batching`` + ``add_request`` so each request gets its own ``max_new_tokens``), with
  ``num_blocks`` set (else it reserves 90 % of RAM) and ``max_batch_tokens`` ``--hf-cb-tokens`` (2048,
  which beat 512 and transformers' own default in a 32-request trial on this CPU).

Metrics follow vLLM's conventions (``minengine.metrics.stats``): output tok/s = generated tokens / wall
time of the whole run; TTFT from time 0 to a request's first token; ITL pooled over all gaps of all
requests. Every engine's outputs are checked against ``hf-sequential``'s (same greedy tokens).

Compute floor: the workload's FLOPs (every computed token through the projections and the MLP, causal
attention's QK^T and PV over its context, the LM head once per output token) divided by the fp32
matmul peak measured in the same run (a 1024^3 product, the better of ``torch.mm`` and oneDNN:
``measure_matmul_flops``), read before each round; every round's ratio uses the highest reading of the run,
since load on a shared machine only lowers one (a reading during a burst once came out at 286 GFLOP/s
between two of 441-475, and would have flattered its round's ratio by a third). No engine can run the
workload faster; ``wall / floor`` says how far from what the hardware allows each one is (issue 13's goal
for minengine on ``llama-100m``: <= 1.4x). Memory per engine: the resident memory its setup added (its
model copy and KV cache as far as touched; HF engines share one model, counted once for each) and the
peak over the pre-run level during its runs (activations, gathered K/V), from ``/proc/self/statm``
sampled every 5 ms; all engines live in one process, so the process peak is printed too.
"""

from __future__ import annotations

import argparse
import os
import resource
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers
from tqdm.auto import tqdm

import minengine
from minengine.core.records import RequestRecord
from minengine.metrics.stats import summarize
from minengine.perf.measure import measure_matmul_flops, measure_read_bandwidth
from minengine.utils import cdiv

try:
    from benchmarks import common, mixed_workload
    from benchmarks.decode_floor import _TokenClock
    from benchmarks.mixed_workload import Workload, make_workload, read_aware_floor, workload_flops
except ImportError:  # run as a script: python benchmarks/throughput.py
    import common  # type: ignore[no-redef]
    import mixed_workload  # type: ignore[no-redef]
    from decode_floor import _TokenClock  # type: ignore[no-redef]
    from mixed_workload import Workload, make_workload, read_aware_floor, workload_flops  # type: ignore[no-redef]

Result = tuple[list[RequestRecord], list[list[int]]]  # per request: record, generated ids
# name: (policy, chunked prefill, compile_decode, attention_backend, linear_kernel, prepack_weights); None =
# the engine's default (on a CPU in fp32: the C++ decode-attention kernel; Linear kernels timed at
# start-up, oneDNN's on prepacked weights); "gather" = the reference attention (context copied, SDPA),
# "torch" = F.linear everywhere
MINENGINE = {
    "minengine-decode-first": ("decode_first", True, False, None, None, None),
    "minengine-decode-first-nochunk": ("decode_first", False, False, None, None, None),
    "minengine-prefill-first": ("prefill_first", True, False, None, None, None),
    "minengine-prefill-first-nochunk": ("prefill_first", False, False, None, None, None),
    "minengine-decode-first-compiled": ("decode_first", True, True, None, None, None),  # fp32 CPU only
    # before 2026-12-02 16:20
    "minengine-decode-first-unpacked": ("decode_first", True, False, None, None, False),
    "minengine-decode-first-gather": ("decode_first", True, False, "gather", None, None),
    # before issue 13's kernels
    "minengine-decode-first-reference": ("decode_first", True, False, "gather", "torch", None),
}
ENGINES = [*MINENGINE, "hf-sequential", "hf-static", "hf-cb"]
OPT_IN = ("minengine-decode-first-compiled", "minengine-decode-first-unpacked",
          "minengine-decode-first-gather", "minengine-decode-first-reference")  # not in the default run
DEFAULT_ENGINES = [e for e in ENGINES if e not in OPT_IN]


def _record(i: int, prompt: list[int], t0: float, token_times: list[float]) -> RequestRecord:
    return RequestRecord(request_id=str(i), arrival_time=t0, num_prompt_tokens=len(prompt),
                         token_times=list(token_times), finish_time=token_times[-1],
                         num_output_tokens=len(token_times), finish_reason="length")


def rss_bytes() -> int:
    """Resident memory of this process now (Linux ``/proc``; elsewhere the peak so far)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if os.uname().sysname == "Darwin" else peak * 1024  # bytes on macOS, KiB on Linux


class PeakRSS:
    """Samples ``rss_bytes()`` on a thread while the block runs; ``peak`` is the highest seen."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak, self._stop = interval, rss_bytes(), threading.Event()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRSS:
        self.start = rss_bytes()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


# --------------------------------------------------------------------------------------------- runs
def run_minengine(path: str, policy: str, chunked: bool, compiled: bool, backend: str | None,
                  linear_kernel: str | None, prepack: bool | None, args: argparse.Namespace,
                  ) -> Callable[[Workload], Result]:
    budget = args.chunk if chunked else args.max_model_len
    # Prefix caching off: every round sends the same prompts, and with the engine's default (on) every
    # round after the first found them cached and skipped their prefill (HF's engines cache nothing). Runs
    # with --rounds 2 before 2026-12-02 15:00 counted that: their second round is not this workload.
    llm = minengine.LLM(path, policy=policy, enable_chunked_prefill=chunked, max_num_batched_tokens=budget,
                        max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                        num_blocks=args.kv_tokens // 16, compile_decode=compiled, attention_backend=backend,
                        linear_kernel=linear_kernel, prepack_weights=prepack, enable_prefix_caching=False)
    graph = llm.llm_engine.model_runner.compiled_decode  # None unless compiled

    def run(w: Workload) -> Result:
        params = [minengine.SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for _, o in w]
        start, compiled_before = time.perf_counter(), graph.num_steps if graph else 0
        outs = llm.generate([p for p, _ in w], params, use_tqdm=False)
        steps = [s for s in llm.step_records if s.start >= start]
        decode = [s for s in steps if s.num_prefill_tokens == 0]
        run.steps = {  # type: ignore[attr-defined]  # where this run's time went (printed under the table)
            "decode_steps": len(decode), "decode_s": sum(s.duration for s in decode),
            "prefill_steps": len(steps) - len(decode),
            "prefill_s": sum(s.duration for s in steps) - sum(s.duration for s in decode),
            "prompt_tokens_computed": sum(s.num_prefill_tokens for s in steps),
            "compiled_steps": graph.num_steps - compiled_before if graph else 0,
        }
        run.prefill_chunks = [c for s in steps for c in s.prefill_chunks]  # type: ignore[attr-defined]
        return list(llm.request_records), [list(o.outputs[0].token_ids) for o in outs]

    return run


def run_hf_sequential(hf: Any) -> Callable[[Workload], Result]:
    from transformers import StoppingCriteriaList

    def run(w: Workload) -> Result:
        t0, records, tokens = time.perf_counter(), [], []
        for i, (prompt, n) in enumerate(w):
            ids, clock = torch.tensor([prompt]), _TokenClock()
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0,
                              stopping_criteria=StoppingCriteriaList([clock]))
            records.append(_record(i, prompt, t0, clock.times))
            tokens.append(out[0, len(prompt):].tolist())
        return records, tokens

    return run


def run_hf_static(hf: Any, batch: int) -> Callable[[Workload], Result]:
    from transformers import StoppingCriteriaList

    def run(w: Workload) -> Result:
        t0, records, tokens = time.perf_counter(), [], []
        for start in range(0, len(w), batch):
            group = w[start:start + batch]
            width, n = max(len(p) for p, _ in group), max(o for _, o in group)
            ids = torch.tensor([[0] * (width - len(p)) + p for p, _ in group])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in group])
            clock = _TokenClock()
            out = hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                              pad_token_id=0, stopping_criteria=StoppingCriteriaList([clock]))
            for j, (prompt, o) in enumerate(group):
                records.append(_record(start + j, prompt, t0, clock.times[:o]))
                tokens.append(out[j, width:width + o].tolist())
        return records, tokens

    return run


def run_hf_cb(hf: Any, args: argparse.Namespace) -> Callable[[Workload], Result]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=args.max_model_len, eos_token_id=-1,
                           pad_token_id=0)
    cb = ContinuousBatchingConfig(num_blocks=cdiv(args.kv_tokens, 256),
                                  max_batch_tokens=args.hf_cb_tokens or None,
                                  max_requests_per_batch=args.max_num_seqs)

    def run(w: Workload) -> Result:
        manager = hf.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.start()
        try:
            t0 = time.perf_counter()
            ids = [manager.add_request(p, max_new_tokens=o, record_timestamps=True, eos_token_id=-1)
                   for p, o in w]
            results: dict[str, Any] = {}
            while len(results) < len(w):
                r = manager.get_result(timeout=1)
                if r is not None and r.is_finished():
                    results[r.request_id] = r
                elif r is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching thread died")
        finally:
            manager.stop(block=True, timeout=10)
        outs = [results[i] for i in ids]
        return ([_record(i, p, t0, r.timestamps) for i, ((p, _), r) in enumerate(zip(w, outs, strict=True))],
                [list(r.generated_tokens) for r in outs])

    return run


# ------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama-12m", choices=sorted(common.SHAPES))
    ap.add_argument("--engines", default=",".join(DEFAULT_ENGINES),
                    help=f"comma-separated, from {', '.join(ENGINES)}")
    mixed_workload.add_args(ap)
    ap.add_argument("--static-batch", type=int, default=16)
    ap.add_argument("--hf-cb-tokens", type=int, default=2048, help="HF CB max_batch_tokens (0 = its default)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--rounds", type=int, default=2, help="runs per engine (order reversed every round)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        mixed_workload.apply_smoke(args)
        args.static_batch, args.hf_cb_tokens, args.rounds = 4, 64, 1
    common.set_threads(args.threads)
    engines = args.engines.split(",")
    unknown = set(engines) - set(ENGINES)
    if unknown:
        ap.error(f"unknown engine(s) {sorted(unknown)}; choose from {ENGINES}")
    print(common.machine_line())
    path = common.model_dir(args.shape)
    before_hf = rss_bytes()
    hf = common.load_hf(path)
    hf_setup = rss_bytes() - before_hf
    vocab = hf.config.vocab_size
    work = mixed_workload.from_args(args, vocab)
    warm = make_workload(2, (8, 32), (4, 8), vocab, args.seed + 1)
    flops = workload_flops(hf.config, work)
    runners: dict[str, Callable[[Workload], Result]] = {}
    setup: dict[str, int] = {}
    for name in engines:
        before = rss_bytes()
        if name in MINENGINE:
            runners[name] = run_minengine(str(path), *MINENGINE[name], args)
        elif name == "hf-sequential":
            runners[name] = run_hf_sequential(hf)
        elif name == "hf-static":
            runners[name] = run_hf_static(hf, args.static_batch)
        elif hasattr(hf, "init_continuous_batching"):
            runners[name] = run_hf_cb(hf, args)
        else:
            print(f"skipping {name}: transformers {transformers.__version__} has no continuous batching")
        setup[name] = rss_bytes() - before + (0 if name in MINENGINE else hf_setup)

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in runners}
    tokens: dict[str, list[list[int]]] = {}
    total = len(runners) * args.rounds
    with torch.inference_mode(), tqdm(total=total, desc="engine runs", dynamic_ncols=True) as bar:
        for run in runners.values():
            run(warm)
        readings: list[tuple[float, float]] = []  # (matmul peak, read bandwidth) before each round
        for r in range(args.rounds):  # odd rounds in reverse order, so no engine always runs last
            readings.append((measure_matmul_flops("cpu"), measure_read_bandwidth("cpu")))
            for name in list(runners)[:: 1 if r % 2 == 0 else -1]:
                bar.set_postfix_str(name)
                load0 = common.loadavg()[0]
                with PeakRSS() as mem:
                    start = time.perf_counter()
                    records, tokens[name] = runners[name](work)
                    wall = time.perf_counter() - start
                s = summarize(records, duration=wall)
                runs[name].append({
                    "wall_s": wall, "output_tok_s": s.total_output_tokens / wall,
                    "output_tokens": s.total_output_tokens, "ttft_p50": s.ttft.median, "ttft_p99": s.ttft.p99,
                    "itl_p50": s.itl.median, "itl_p99": s.itl.p99, "load": [load0, common.loadavg()[0]],
                    "run_peak_bytes": mem.peak - mem.start, **getattr(runners[name], "steps", {}),
                })
                bar.update(1)
    peak_flops, bandwidth = (max(x) for x in zip(*readings, strict=True))  # the run's best readings
    read_floor = read_aware_floor(hf.config, work, peak_flops, bandwidth)
    for rs in runs.values():
        for x in rs:
            x.update(matmul_flops=peak_flops, floor_s=flops / peak_flops,
                     floor_ratio=x["wall_s"] * peak_flops / flops, read_floor_s=read_floor,
                     read_floor_ratio=x["wall_s"] / read_floor)
    results: dict[str, Any] = {}
    for name, rs in runs.items():  # medians over rounds (the mean of two)
        results[name] = {k: common.median([x[k] for x in rs]) for k in rs[0] if k != "load"}
        results[name]["per_round_tok_s"] = [x["output_tok_s"] for x in rs]
        results[name]["load"] = [x for run in rs for x in run["load"]]
        results[name]["run_peak_bytes"] = max(x["run_peak_bytes"] for x in rs)
        results[name]["setup_bytes"] = setup[name]
        results[name]["workload_flops"] = flops
    ref = tokens.get("hf-sequential")
    expected = sum(o for _, o in work)
    for name, r in results.items():
        assert r["output_tokens"] == expected, f"{name} generated {r['output_tokens']} tokens, not {expected}"
        # [request, first token that differs]: in fp32 a different summation order (oneDNN's blocking, the
        # GEMV's split) can flip a greedy pick where HF's top two logits tie to ~1e-5
        differs = None if ref is None else [
            [i, next(j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)]
            for i, (a, b) in enumerate(zip(tokens[name], ref, strict=True)) if a != b]
        r["differs_from_hf_sequential"] = differs
        r["same_as_hf_sequential"] = None if differs is None else len(work) - len(differs)
    _print(results, args, work)
    print(f"process peak RSS {_peak_rss_bytes() / 2**20:,.0f} MiB (all engines in one process)")
    common.save_json(args.json, {"results": results, "args": vars(args),
                                 "process_peak_rss": _peak_rss_bytes(), "readings": readings})
    return results


def _print(results: dict[str, Any], args: argparse.Namespace, work: Workload) -> None:
    print(f"\ncommand: {common.command_line()}")
    print(common.machine_line())
    n_in, n_out = sum(len(p) for p, _ in work), sum(o for _, o in work)
    print(f"{args.shape} fp32, {len(work)} requests ({n_in} prompt + {n_out} output tokens), chunk budget "
          f"{args.chunk}, max_num_seqs {args.max_num_seqs}, HF static batch {args.static_batch}, HF CB "
          f"max_batch_tokens {args.hf_cb_tokens or 'default'}; medians of {args.rounds} rounds")
    any_run = next(iter(results.values()))
    print(f"compute floor: {any_run['workload_flops'] / 1e9:,.1f} GFLOP / "
          f"{any_run['matmul_flops'] / 1e9:.0f} GFLOP/s (fp32 matmul peak: the better of MKL and oneDNN, the "
          f"highest of the rounds' readings) = {any_run['floor_s']:.1f} s; with the weights' and K/V's read "
          f"per decode step (`read_aware_floor`): {any_run['read_floor_s']:.1f} s\n")
    base = {k: results[k]["output_tok_s"] for k in ("hf-sequential", "hf-cb") if k in results}
    rows = []
    for name, r in results.items():
        ratios = [f"{r['output_tok_s'] / v:.2f}x" for v in base.values()]
        same = "-" if r["same_as_hf_sequential"] is None else f"{r['same_as_hf_sequential']}/{len(work)}"
        per_round = " / ".join(f"{x:.0f}" for x in r["per_round_tok_s"])
        rows.append([name, f"{r['wall_s']:.1f}", f"**{r['floor_ratio']:.2f}x**",
                     f"{r['read_floor_ratio']:.2f}x", f"**{r['output_tok_s']:.0f}** ({per_round})", *ratios,
                     f"{1e3 * r['ttft_p50']:.0f}", f"{1e3 * r['ttft_p99']:.0f}", f"{1e3 * r['itl_p50']:.1f}",
                     f"{1e3 * r['itl_p99']:.1f}", same, f"{r['setup_bytes'] / 2**20:,.0f}",
                     f"{r['run_peak_bytes'] / 2**20:,.0f}", " ".join(f"{x:.2f}" for x in r["load"])])
    header = ["engine", "wall s", "wall / compute floor", "wall / read-aware floor",
              "output tok/s (per round)", *(f"vs {k}" for k in base), "TTFT p50 ms", "TTFT p99 ms",
              "ITL p50 ms", "ITL p99 ms", "same tokens as HF seq", "setup RSS MiB", "run peak RSS +MiB",
              "load avg (start/end of runs)"]
    print(common.md_table(header, rows))
    for name, r in results.items():
        if "decode_steps" in r:
            print(f"{name}: {r['prefill_steps']:.0f} steps with prompt tokens took {r['prefill_s']:.1f} s, "
                  f"{r['decode_steps']:.0f} all-decode steps {r['decode_s']:.1f} s "
                  f"({r['compiled_steps']:.0f} of them compiled)")
        if r.get("differs_from_hf_sequential"):
            where = ", ".join(f"request {i} from its token {j}" for i, j in r["differs_from_hf_sequential"])
            print(f"{name}: greedy tokens differ from hf-sequential's in {where}")


if __name__ == "__main__":
    main()
