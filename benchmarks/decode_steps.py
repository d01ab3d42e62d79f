"""Decode step time vs batch size on the real engine (median over pure-decode steps).

    .venv/bin/python benchmarks/decode_steps.py                 # shipped model, batches 1..32
    .venv/bin/python benchmarks/decode_steps.py --threads 1 --batches 1,32
    .venv/bin/python benchmarks/decode_steps.py --smoke
    .venv/bin/python benchmarks/decode_steps.py --model benchmarks/out/models/llama-12m-float32-s0 \
        --batches 64 --prompt-len 400 --steps 10 --profile      # where a batch-64 decode step goes
    .venv/bin/python benchmarks/decode_steps.py --model benchmarks/out/models/llama-100m-float32-s0 \
        --batches 64 --prompt-len 290 --steps 5 --threads 2 --num-blocks 3000 --profile
    .venv/bin/python benchmarks/decode_steps.py --model benchmarks/out/models/llama-100m-float32-s0 \
        --batches 64 --prompt-len 290 --steps 5 --threads 2 --num-blocks 3000 --compile-decode

Every request gets a short prompt and ``ignore_eos`` so all of them decode for the same number of
steps; only steps that ran exactly ``batch`` decodes and no prefill are kept, so the median is a clean
decode step. Where tok/s stops growing with the batch, decode has left the bandwidth roof for the
compute roof (on a 2-core CPU that happens near batch 10, not hundreds as on a GPU).
"""

from __future__ import annotations

import argparse
import statistics

import minengine
from minengine.utils import cdiv

try:
    from benchmarks import common
except ImportError:  # run as a script: python benchmarks/decode_steps.py
    import common  # type: ignore[no-redef]


def measure(llm: minengine.LLM, batch: int, steps: int, prompt_len: int) -> tuple[float, float]:
    prompts = [[(7 * i + j) % 500 + 10 for j in range(prompt_len)] for i in range(batch)]
    # early requests decode while later prompts are still prefilling: give them room for those steps too
    budget = llm.config.max_num_batched_tokens or 1
    extra = cdiv(batch * prompt_len, budget) + 1
    params = minengine.SamplingParams(temperature=0, max_tokens=steps + extra, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    pure = [s for s in llm.step_records if s.num_prefill_tokens == 0 and s.num_decode_seqs == batch]
    return statistics.median(s.duration for s in pure), statistics.median(s.t_forward for s in pure)


def main(argv: list[str] | None = None) -> dict[int, tuple[float, float]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="shipped name, HF folder or hub id (default: shipped)")
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--steps", type=int, default=30, help="decode steps per batch size")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--num-blocks", type=int, default=None,
                    help="KV blocks (default: sized from memory; big batches x long prompts may need more)")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler table of 5 decode steps at the largest batch")
    ap.add_argument("--compile-decode", action="store_true",
                    help="CPU, fp32: decode steps as one compiled graph (attention reads the KV cache in "
                         "place)")
    ap.add_argument("--smoke", action="store_true", help="batches 1 and 4, 3 steps")
    args = ap.parse_args(argv)
    if args.smoke:
        args.batches, args.steps = "1,4", 3
    common.set_threads(args.threads)
    if args.profile and args.compile_decode:
        # name each generated kernel in the profile, not just "the graph"
        import torch._inductor.config

        torch._inductor.config.cpp.enable_kernel_profile = True
    llm = minengine.LLM(model=args.model, enable_prefix_caching=False, num_blocks=args.num_blocks,
                        compile_decode=args.compile_decode)
    print(f"command: {common.command_line()}")
    print(common.machine_line() + f"; device {llm.llm_engine.model.device}")
    measure(llm, 1, 3, args.prompt_len)  # warm-up
    print(f"{'batch':>5}  {'step ms':>8}  {'forward ms':>10}  {'tok/s':>8}")
    results = {}
    for batch in (int(b) for b in args.batches.split(",")):
        step, forward = results[batch] = measure(llm, batch, args.steps, args.prompt_len)
        print(f"{batch:>5}  {step * 1e3:>8.2f}  {forward * 1e3:>10.2f}  {batch / step:>8.0f}")
    if args.profile:
        profile(llm, max(results), args.prompt_len)
    return results


def profile(llm: minengine.LLM, batch: int, prompt_len: int) -> None:
    """Top ops by self CPU time over 5 pure-decode steps of ``batch`` requests."""
    import torch

    engine = llm.llm_engine
    budget = llm.config.max_num_batched_tokens or 1
    params = minengine.SamplingParams(temperature=0, max_tokens=10 + cdiv(batch * prompt_len, budget),
                                      ignore_eos=True)
    for i in range(batch):
        engine.add_request(None, [(7 * i + j) % 500 + 10 for j in range(prompt_len)], params)
    while engine.scheduler.waiting or any(r.is_prefill for r in engine.scheduler.running):
        engine.step()  # prefill everything first
    with torch.profiler.profile() as prof:
        for _ in range(5):
            engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    print(f"\n5 decode steps at batch {batch}, prompt {prompt_len} tokens:")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
