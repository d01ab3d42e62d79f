"""Decode step time vs batch size on the real engine (median over pure-decode steps).

    .venv/bin/python benchmarks/decode_steps.py                 # shipped model, batches 1..32
    .venv/bin/python benchmarks/decode_steps.py --threads 1 --batches 1,32

Every request gets a short prompt and ``ignore_eos`` so all of them decode for the same number of
steps; only steps that ran exactly ``batch`` decodes and no prefill are kept, so the median is a clean
decode step. Prints the machine it ran on, because CPU timings mean little without it.
"""

from __future__ import annotations

import argparse
import platform
import statistics

import torch

import minengine


def measure(llm: minengine.LLM, batch: int, steps: int, prompt_len: int) -> tuple[float, float]:
    prompts = [[(7 * i + j) % 500 + 10 for j in range(prompt_len)] for i in range(batch)]
    params = minengine.SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    pure = [s for s in llm.step_records if s.num_prefill_tokens == 0 and s.num_decode_seqs == batch]
    return statistics.median(s.duration for s in pure), statistics.median(s.t_forward for s in pure)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="shipped name, HF folder or hub id (default: shipped)")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--steps", type=int, default=30, help="decode steps per batch size")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = minengine.LLM(model=args.model, enable_prefix_caching=False)
    print(f"machine: {platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, device {llm.llm_engine.model.device}")
    measure(llm, 1, 3, args.prompt_len)  # warm-up
    print(f"{'batch':>5}  {'step ms':>8}  {'forward ms':>10}  {'tok/s':>8}")
    for batch in (int(b) for b in args.batches.split(",")):
        step, forward = measure(llm, batch, args.steps, args.prompt_len)
        print(f"{batch:>5}  {step * 1e3:>8.2f}  {forward * 1e3:>10.2f}  {batch / step:>8.0f}")


if __name__ == "__main__":
    main()
