"""The final quiz's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a KV transfer between a prefill and a decode pool (Q2: model, prompt length,
link speed), a traffic forecast for the concurrency question (Q4) and a decode GPU's load for the KV
utilisation question (Q5), and computes the keys, tolerances and explanations. Strings go into the
question text, numbers into the hidden tests.

KV bytes per token are those of each model's config.json (lesson 04's formula); link speeds are the
usual datacenter ones, quoted in gigabits per second as vendors do.
"""

from __future__ import annotations

import random

# name, KV cache dtype, KiB per token (2 x layers x KV heads x head_dim x bytes / 1024)
KV_MODELS = [
    ("Llama-3.1-8B", "bf16", 128),
    ("Llama-3.1-8B", "fp8", 64),
    ("Qwen2.5-7B", "bf16", 56),
    ("Qwen2.5-32B", "bf16", 256),
    ("Llama-3.1-70B", "bf16", 320),
    ("Llama-3.1-70B", "fp8", 160),
]
LINKS_GBPS = [25, 100, 200, 400]


def _kv_transfer(rng: random.Random) -> dict:
    model, dtype, kib = rng.choice(KV_MODELS)
    prompt = rng.choice([2000, 4000, 6000, 8000, 16000])
    gbps = rng.choice(LINKS_GBPS)
    nbytes = prompt * kib * 1024
    gb_per_s = gbps / 8
    key = round(1000 * nbytes / (gb_per_s * 1e9), 2)
    tol = round(0.03 * key, 2)
    return {
        "q2_setup": (f"{model} with its KV cache in {dtype} ({kib} KiB per token); a request arrives with "
                     f"{'an' if prompt == 8000 else 'a'} {prompt:,}-token prompt, and the two pools are "
                     f"connected by a {gbps} Gb/s link (gigabits per second)"),
        "q2_key": key,
        "q2_bits": round(key / 8, 3),
        "q2_tol": tol,
        "q2_tol_text": f"{tol:g}",
        "q2_why": (f"The decode instance needs the prompt's whole KV cache: {prompt:,} tokens x {kib} KiB = "
                   f"{nbytes:,} bytes ({nbytes / 1e9:.2f} GB). A {gbps} Gb/s link carries {gbps} / 8 = "
                   f"{gb_per_s:g} GB/s, so the transfer takes {nbytes / 1e9:.3f} / {gb_per_s:g} s = {key:g} "
                   "ms (plus a fixed latency, ignored here). Forgetting that links are quoted in bits gives "
                   f"an answer 8x too small. Where the user feels it depends on the design: when the "
                   "prefill instance returns the first token (lesson 09's simulator), it lands in the first "
                   "inter-token gap; when the decode instance streams the whole answer (vLLM's "
                   "disaggregated-prefill proxies send max_tokens=1 to the prefill side), it lands in TTFT. "
                   f"Next to an SLO of tens of ms, a transfer of this size "
                   f"{'is small' if key < 10 else 'matters' if key < 100 else 'breaks it on its own'}. "
                   f"It grows with the prompt, which is why disaggregation runs on fast fabrics."),
    }


def _concurrency(rng: random.Random) -> dict:
    rate = rng.choice([40, 60, 80, 120, 150])
    out = rng.choice([120, 200, 300])
    tpot = rng.choice([20, 25, 30, 40])
    gpus = rng.choice([4, 6, 8, 12])
    total = rate * out * tpot / 1000
    key = round(total / gpus, 1)
    tol = round(0.03 * key, 1)
    return {
        "q4_rate": str(rate),
        "q4_out": str(out),
        "q4_tpot": str(tpot),
        "q4_gpus": str(gpus),
        "q4_key": key,
        "q4_fleet": round(total, 1),
        "q4_tol": tol,
        "q4_tol_text": f"{tol:g}",
        "q4_why": (f"Little's law on the decode pool: sequences decoding at once = the rate at which they "
                   f"arrive x how long each one decodes. Each request decodes for about {out} tokens x "
                   f"{tpot} ms = {out * tpot / 1000:g} s, so the fleet holds {rate} x {out * tpot / 1000:g} "
                   f"= {total:g} sequences, {total:g} / {gpus} = {key:g} per decode GPU. This is the batch "
                   "each GPU must run (and the KV cache it must keep resident) to hold that TPOT, the "
                   f"number that sets max_num_seqs; {rate} requests/s alone says nothing about it until you "
                   f"know how many tokens each answer has."),
    }


def _kv_use(rng: random.Random) -> dict:
    while True:  # a load that fits, with room between the average and the full-length count
        seqs = rng.choice([48, 64, 96, 128, 160, 192])
        prompt = rng.choice([600, 900, 1200, 1500, 2000])
        out = rng.choice([200, 300, 400, 600, 800])
        kib = rng.choice([64, 128])
        cap_gib = rng.choice([20, 30, 40, 50, 60])
        tokens = seqs * (prompt + out / 2)
        used_gib = tokens * kib / 1024 / 1024
        key = round(100 * used_gib / cap_gib, 1)
        full = round(100 * seqs * (prompt + out) * kib / 1024 / 1024 / cap_gib, 1)
        tol = round(max(1.0, 0.02 * key), 1)
        if 35 <= key <= 90 and full - key > 2 * tol:
            break
    return {
        "q5_seqs": str(seqs),
        "q5_prompt": f"{prompt:,}",
        "q5_out": str(out),
        "q5_kv": str(kib),
        "q5_cap": str(cap_gib),
        "q5_key": key,
        "q5_full": full,
        "q5_tol": tol,
        "q5_tol_text": f"{tol:g}",
        "q5_why": ("A sequence caught halfway through its answer holds its prompt and half its output: "
                   f"{prompt:,} + {out} / 2 = {prompt + out / 2:,.0f} tokens. {seqs} of them hold "
                   f"{tokens:,.0f} tokens x {kib} KiB = {used_gib:.2f} GiB, {key:g}% of the {cap_gib} GiB "
                   "cache. That is the average; the long prompts of the tail and bursts of arrivals push it "
                   "higher, and once the cache is full the scheduler preempts (lesson 05), so a plan keeps "
                   f"headroom. Counting every sequence at its full length ({full:g}%) sizes for the worst "
                   "moment of every request at once."),
    }


def _token_cost(rng: random.Random) -> dict:
    # On-demand H100 list prices ran about $2.50-5.00 per GPU-hour in May 2026 (Mercatus' cloud GPU survey).
    gpus = rng.choice([4, 8, 16, 24])
    price = rng.choice([2.0, 2.5, 3.0, 3.5, 4.0, 4.5])
    tps = rng.choice([1200, 1500, 1800, 2400, 3000])
    load = rng.choice([30, 35, 40, 45, 50, 60])
    key = round(price / (tps * load / 100 * 3600) * 1e6, 3)
    peak = round(price / (tps * 3600) * 1e6, 3)
    tol = round(max(0.01, 0.03 * key), 3)
    return {
        "q11_gpus": str(gpus),
        "q11_price": f"{price:.2f}",
        "q11_tps": f"{tps:,}",
        "q11_load": str(load),
        "q11_key": key,
        "q11_peak": peak,
        "q11_tol": tol,
        "q11_tol_text": f"{tol:g}",
        "q11_why": (f"Each GPU costs ${price:.2f} every hour, busy or not, and makes on average {load}% "
                    f"of its peak: {tps:,} x {load / 100:g} = {tps * load / 100:,.0f} output tokens/s, "
                    f"{tps * load / 100 * 3600 / 1e6:.2f} million an hour. ${price:.2f} / "
                    f"{tps * load / 100 * 3600 / 1e6:.2f} million = ${key:.3f} per million output tokens. "
                    f"The fleet's size cancels out ({gpus} GPUs cost {gpus}x as much and make {gpus}x as "
                    f"many tokens). At the peak alone it would be ${peak:.3f}: the quiet hours are paid for "
                    "too, which is why operators autoscale or fill the valleys with batch work."),
    }


def _long_answers(rng: random.Random) -> dict:
    # name, bandwidth TB/s (datasheets); model, KV KiB per token (bf16, from config.json), weights GB
    gpu, tbps = rng.choice([("A100 80GB SXM", 2.04), ("H100 SXM", 3.35), ("H200 SXM", 4.8)])
    model, kib, weights_gb = rng.choice([("Llama-3.1-8B", 128, 16), ("Qwen2.5-14B", 192, 29.5)])
    reports = rng.choice([4, 6, 8, 12, 16])
    context = rng.choice([3000, 4000, 6000, 8000])
    extra_gb = reports * context * kib * 1024 / 1e9
    key = round(extra_gb / tbps, 2)  # GB / (TB/s) = ms
    base = weights_gb / tbps
    tol = round(max(0.05, 0.03 * key), 2)
    return {
        "q12_gpu": gpu,
        "q12_tbps": f"{tbps:g}",
        "q12_model": model,
        "q12_weights": f"{weights_gb:g}",
        "q12_kib": str(kib),
        "q12_reports": str(reports),
        "q12_context": f"{context:,}",
        "q12_key": key,
        "q12_one": round(key / reports, 2),
        "q12_tol": tol,
        "q12_tol_text": f"{tol:g}",
        "q12_why": (f"Each decode step reads every running sequence's cache. {reports} reports x {context:,} "
                    f"tokens x {kib} KiB = {extra_gb:.2f} GB more per step, which at {tbps:g} TB/s takes "
                    f"{key:.2f} ms: the chat turns' steps grow from about {base:.1f} ms (the weights alone) "
                    f"to about {base + key:.1f} ms, {100 * key / base:.0f}% longer, for as long as the "
                    "reports are writing. On an instance of their own the chats' steps read the weights "
                    "and their own short caches only."),
    }


def params(seed: int) -> dict:
    rng = random.Random(f"quiz5_final/{seed}")
    return {**_kv_transfer(rng), **_concurrency(rng), **_kv_use(rng), **_token_cost(rng),
            **_long_answers(rng)}
