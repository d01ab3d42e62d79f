"""The final quiz's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a KV transfer between a prefill and a decode pool (Q2: model, prompt length,
link speed), a traffic forecast for the concurrency question (Q4) and a decode GPU's load for the KV
utilisation question (Q5), a fleet's cost (Q11) and long answers beside chat turns (Q12), and computes
the keys, tolerances and explanations. For the multiple-choice questions it draws a scenario (Q1 the
service a split is proposed for, Q3 which chip has the FLOP/s, Q6 the forecast's lengths, Q7 what the
plan needs from the prompt lengths, Q8 how far the diagnosis got, Q9 the symptoms after a launch, Q10
what is already in place against mixed-step stalls) and marks the option it makes right
(``* [@@q1_pays@@]``), so another course's answer sheet is no key. Strings go into the question text,
numbers into the hidden tests.

KV bytes per token are those of each model's config.json (lesson 04's formula); link speeds are the
usual datacenter ones, quoted in gigabits per second as vendors do.
"""

from __future__ import annotations

import random

from minengine.course.templating import option_marks as _marks

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


# Q1: an 8B model's KV cache in bf16 (Llama-3.1-8B: 128 KiB per token), the documents' prompts, the slow link
Q1_KIB, Q1_DOC_PROMPT, Q1_SLOW_GBPS = 128, 6000, 10


def _split_or_not(rng: random.Random) -> dict:
    """Q1: whether separate prefill and decode pools raise goodput follows from the service: long prompts
    with a tight TPOT on a fast fabric (yes), short prompts or a loose TPOT (little changes), a slow link
    (it falls)."""
    kind = rng.choice(["pays", "short", "loose", "link"])
    prompt = 150 if kind == "short" else Q1_DOC_PROMPT
    what = ("a chat bot, with 150-token prompts and 300-token answers" if kind == "short" else
            f"document Q&A, with {Q1_DOC_PROMPT:,}-token prompts and 150-token answers")
    tpot = 100 if kind == "loose" else 15
    fabric = ("the GPUs talk over 10 Gb/s Ethernet" if kind == "link" else "the GPUs share a fast fabric")
    nbytes = prompt * Q1_KIB * 1024
    move_s = nbytes / (Q1_SLOW_GBPS / 8 * 1e9)
    prefill_s = 2 * 8e9 * prompt / 989e12
    why = {
        "pays": ("Long prompts with a tight TPOT are the case disaggregation is for. Colocated, every decode "
                 f"step that carries a chunk of a {prompt:,}-token prompt runs longer, and with prompts this "
                 "long many steps carry one, so a 15 ms TPOT breaks long before the GPUs run out of work. "
                 "Separate pools keep the decode steps pure, and on a fast fabric the KV cache crosses in "
                 "a small fraction of the prefill that made it. The prompts are not short and the TPOT is "
                 "not loose, so neither 'little changes' reason holds, and nothing here is slow to move: "
                 "goodput does not fall."),
        "short": ("Chat prompts of 150 tokens add little to each decode step, so colocated with chunked "
                  "prefill there is little interference to remove (lesson 09: for chat traffic the best "
                  "split gains a few percent at most), while a split pins GPUs to one phase, and one pool "
                  "sits idle part of the time. So goodput does not rise much, although the 15 ms TPOT is "
                  "tight: the 'loose TPOT' reason does not apply, and the fast fabric moves a 150-token "
                  f"cache ({nbytes / 1e6:.0f} MB) in no time, so goodput does not fall either."),
        "loose": ("A TPOT of 100 ms is met colocated even when prompt chunks ride in the decode steps, and "
                  "colocation lets every GPU work on whichever phase is busy, which a fixed split gives up "
                  "(lesson 09: with a loose TPOT no split does meaningfully better). So little changes. "
                  f"It does not rise, though the {prompt:,}-token prompts are long: the interference they "
                  "cause stays well inside a 100 ms TPOT. The fast fabric moves their KV cache quickly, so "
                  "it does not fall."),
        "link": (f"A {prompt:,}-token prompt's KV cache is {prompt:,} x {Q1_KIB} KiB = {nbytes / 1e9:.2f} "
                 f"GB. 10 Gb/s Ethernet carries 1.25 GB/s, so it takes {move_s:.2f} s to cross, several "
                 f"times its prefill (2 x 8 billion x {prompt:,} FLOP, about {prefill_s:.1f} s even at the "
                 "H100's 989 TFLOP/s peak). That delay lands on the user: in TTFT, over the 500 ms SLO on "
                 "its own, when the decode instance streams the answer; in the first inter-token gap, far "
                 "over 15 ms, when the prefill instance sends the first token. Goodput falls. On a fast "
                 "fabric the same service would be the case disaggregation is for (long prompts, tight "
                 "TPOT), which is why neither 'little changes' reason fits."),
    }[kind]
    service = f"{what}, SLOs of TTFT 500 ms and TPOT {tpot} ms, and {fabric}"
    return {"q1_service": service, **_marks("q1", ("pays", "short", "loose", "link"), kind),
            "q1_why": repr(why)}


Q3_FLOPS = "twice an H100's dense FLOP/s and the H100's memory bandwidth"
Q3_BANDWIDTH = "an H100's dense FLOP/s and 1.4× its memory bandwidth (like an H200)"


def _place_chips(rng: random.Random) -> dict:
    """Q3: the chip with the FLOP/s goes to prefill, the one with the bandwidth to decode; which of X and Y
    has which, the seed decides."""
    flops_chip = rng.choice(["X", "Y"])
    bw_chip = "Y" if flops_chip == "X" else "X"
    specs = {flops_chip: Q3_FLOPS, bw_chip: Q3_BANDWIDTH}
    why = ("Each pool can now get the hardware its phase needs. Prefill does thousands of FLOPs per weight "
           "byte (its matmuls have a prompt's worth of rows), far above any ridge, so its time, and TTFT, "
           f"follow the FLOP/s: {flops_chip}, with twice an H100's. Decode reads all the weights and every "
           "sequence's KV cache each step for one token per sequence; attention stays near the GQA group "
           "size in FLOP/byte whatever the batch, so decode steps follow the bandwidth: "
           f"{bw_chip}, with 1.4x. The opposite placement puts each chip where its strength is wasted. The "
           f"higher FLOP/s in both pools do nothing for a decode step that waits for memory. And the link "
           "sets the transfer time, not the speed of either pool's steps.")
    return {"q3_x": specs["X"], "q3_y": specs["Y"],
            **_marks("q3", ("x_prefill", "y_prefill"), f"{flops_chip.lower()}_prefill"),
            "q3_why": repr(why)}


# Q6: the benchmark (128-token prompts and answers, 12 requests/s per GPU) and the forecast (150 requests/s)
Q6_TRAFFIC = {"prompt": (1600, 90), "answer": (100, 2000), "short": (60, 20)}


def _benchmark_plan(rng: random.Random) -> dict:
    """Q6: a plan from a benchmark's requests per second is wrong in the direction of the traffic's tokens:
    long prompts (prefill), long answers (decode, concurrency, KV) or short requests (too many GPUs)."""
    kind = rng.choice(sorted(Q6_TRAFFIC))
    prompt, out = Q6_TRAFFIC[kind]
    bench, fleet = 12 * 128, 13 * 12 * 128  # tokens/s of each kind, per benchmark GPU and for 13 of them
    p_rate, o_rate = 150 * prompt, 150 * out
    start = ("A request rate says nothing about the work until you know its tokens. The benchmark's GPU took "
             f"in 12 x 128 = {bench:,} prompt tokens/s and made {bench:,} output tokens/s; 13 such GPUs do "
             f"{fleet:,} of each. The forecast brings 150 x {prompt:,} = {p_rate:,} prompt tokens/s and 150 "
             f"x {out:,} = {o_rate:,} output tokens/s. ")
    end = {
        "prompt": (f"The prompt tokens are {p_rate / fleet:.0f} times what 13 benchmark GPUs took in: they "
                   "would drown in queued prompts (TTFT explodes while TPOT still looks fine), and at the "
                   f"benchmark's rate the prefill alone is about {p_rate / bench:.0f} GPUs' worth. The "
                   "shorter answers save some decode work, far from enough to offset that, so the answer is "
                   "not 'too many', and the answers, shorter than the benchmark's, are not what binds. A "
                   "parallel pass is not a free one: prefill is compute-bound, so its time grows with the "
                   "prompt's tokens."),
        "answer": (f"The output tokens are {o_rate / fleet:.0f} times what 13 benchmark GPUs made, and by "
                   "Little's law (rate x decode time) each GPU holds about that many times the benchmark's "
                   f"decoding sequences, each with a cache of up to {prompt + out:,} tokens instead of 256: "
                   "every step carries a far bigger batch and reads far more KV, so the steps lengthen and "
                   "the TPOT the benchmark met breaks (or the cache fills and requests are preempted). The "
                   "prompts are shorter than the benchmark's, so prefill is not the problem, and the plan is "
                   "not too large. A request holds its batch slot, and its KV blocks, for every token it "
                   "decodes, so its length is what counts."),
        "short": (f"Both are far below what 13 benchmark GPUs handled ({p_rate / fleet:.2f} and "
                  f"{o_rate / fleet:.2f} of it): each request is less prefill and much less decode work, "
                  "with fewer sequences decoding at once (Little's law), so a GPU serves more than 12 of "
                  "these requests a second within the SLOs and the plan asks for too many GPUs. Neither the "
                  "prompts nor the answers are longer than the benchmark's, so 'far too few' does not "
                  "apply, and the lengths do change the answer: a request's work is its tokens."),
    }[kind]
    tail = (" Plan from input and output tokens per second, concurrent sequences and the KV they hold, "
            "then check the plan in a simulator or a replay.")
    traffic = f"prompts of {prompt:,} tokens and answers of {out:,} on average"
    return {"q6_traffic": traffic, **_marks("q6", ("prompt", "answer", "short"), kind),
            "q6_why": repr(start + end + tail)}


def _prompt_statistic(rng: random.Random) -> dict:
    """Q7: the mean sets the token rates, the tail what one long request brings, the median the typical
    request's latency at light load; which the plan needs, the seed decides."""
    kind = rng.choice(["mean", "p99", "median"])
    need = {
        "mean": "the prefill work per second the fleet must do at the forecast 150 requests/s",
        "p99": ("the KV cache and the prefill time of one document-pasting user's request, to check that "
                "the cache and the chunk budget leave room for it"),
        "median": ("the TTFT of the middle user at light load (half of the users get theirs sooner), to "
                   "quote on the status page"),
    }[kind]
    why = {
        "mean": ("Prefill work per second is the arrival rate times the mean prompt: 150 x 900 = 135,000 "
                 "prompt tokens/s. The mean, pulled up by the long tail, is exactly what the GPUs must "
                 "compute; the median (a third of it) would undersize the fleet three times, and sizing "
                 "every prompt at the p99 would buy about 15 times the prefill capacity needed. "),
        "p99": ("One request's KV cache and prefill grow with its own prompt, so the question is about the "
                "tail: a 14,000-token prompt holds a KV cache of 14,000 tokens (1.71 GiB at Llama-3.1-8B's "
                "128 KiB per token), makes the biggest prefill (so the chunk budget and these users' TTFT), "
                "and decides how many fit beside it. The mean (900) and the median (300) describe other "
                "requests; sized with them the engine is not ready for the requests it will get. "),
        "median": ("At light load nothing waits, so a request's TTFT is its prefill, which grows with its "
                   "prompt: the middle prompt (the median, 300 tokens) gives the middle TTFT. The mean, 900 "
                   "tokens, pulled up by a few long documents, would quote a TTFT that most users beat, and "
                   "the p99 the wait of the unluckiest one in a hundred. "),
    }[kind] + ("The three figures are far apart (300, 900 and 14,000 tokens), so which one a number is built "
               "on changes the plan a lot. Averages hide groups (lesson 03): split the traffic by length "
               "first, then plan each part.")
    return {"q7_need": need, **_marks("q7", ("mean", "median", "p99"), kind), "q7_why": repr(why)}


def _diagnosis_stage(rng: random.Random) -> dict:
    """Q8: the diagnosis order, from where the investigation stands: nothing yet (one request's trace),
    after the trace (length groups), after the groups (quiet vs loaded)."""
    kind = rng.choice(["trace", "groups", "quiet"])
    done = {
        "trace": "You have not looked at anything else yet.",
        "groups": ("You have taken the slowest request's trace apart: most of its time passed before its "
                   "first token, and its stream was smooth after that."),
        "quiet": ("You have taken the slowest request's trace apart (most of its time passed before its "
                  "first token) and split the requests by prompt length: short and long ones are slowed "
                  "alike."),
    }[kind]
    why = ("A mean end-to-end latency mixes the queue, the prefill, the first token and every decode step of "
           "every request, and each has different causes and fixes. The order: one request's trace to see "
           "where its time went; then the traffic grouped by prompt and output length; then quiet against "
           "loaded runs; then mixed prefill-decode steps; then cache pressure, all before touching "
           "kernels. " +
           {"trace": "Nothing has been looked at yet, so the trace comes first; the length groups and the "
                     "quiet run come after it, once you know which part of the request to compare.",
            "groups": "The trace is done and points at the time before the first token, so the next stage "
                      "splits the traffic by length: is it the long prompts that wait, or everyone? A trace "
                      "needs no repeating, and the quiet run comes after the groups.",
            "quiet": "The trace and the length groups are done, and everyone is slowed alike, so the next "
                     "stage sends the same requests one at a time: fast alone and slow under load points to "
                     "queueing or admission, not the model. Repeating an earlier stage adds nothing."}[kind] +
           " Profiling kernels first tunes what may not be slow: a slow kernel would make the requests slow "
           "alone too, and the order rules that out before anyone profiles.")
    return {"q8_done": done, **_marks("q8", ("trace", "groups", "quiet"), kind), "q8_why": repr(why)}


def _where_to_look(rng: random.Random) -> dict:
    """Q9: the symptoms after a launch point at cache pressure (preemptions), at mixed steps (an ITL
    tail) or at the load (a growing queue with a roomy cache)."""
    kind = rng.choice(["cache", "budget", "load"])
    symptoms = {
        "cache": ("p99 TTFT went from 0.6 s to 5 s and end-to-end latencies doubled. Alone, the same "
                  "requests are as fast as ever. Under load, `vllm:kv_cache_usage_perc` sits at 1.0 and "
                  "`vllm:num_preemptions` climbs by hundreds a minute; decode steps take their usual time."),
        "budget": ("p99 ITL went from 40 ms to 700 ms while the median stayed at 25 ms, and TTFT is as "
                   "before. The slow gaps fall in steps that carry tokens of the feature's prompts, which "
                   "run to 20,000 tokens. `vllm:kv_cache_usage_perc` stays under 0.6, with no preemptions."),
        "load": ("p99 TTFT went from 0.6 s to 5 s and end-to-end latencies grew by about as much. Alone, the "
                 "same requests are as fast as ever. Under load, `vllm:num_requests_waiting` grows through "
                 "the evening peak while `vllm:kv_cache_usage_perc` stays under 0.5, with no preemptions; "
                 "decode steps take their usual time, and ITL is as before. The feature brought 60 % more "
                 "requests."),
    }[kind]
    why = {
        "cache": ("A cache at 100% with preemptions climbing means running requests are evicted and later "
                  "recomputed: their work is redone, they queue again, and new requests cannot be admitted, "
                  "which looks like queueing from outside (TTFT up, E2E up, fast alone). The fix is on the "
                  "memory side: what the new feature sends (longer prompts, uncapped outputs), a "
                  "max_num_seqs too high for the cache, or more KV memory (an fp8 KV cache, more GPUs). "
                  "Mixed-step interference would show as uneven streams (an ITL tail), not preemptions, and "
                  "a plain overload would leave the cache room and preempt nothing. "),
        "budget": ("An ITL tail with a steady median, in the steps that carry prompt tokens, is mixed-step "
                   "interference: every decoding stream waits for each step that computes a big piece of "
                   "a long prompt. Look at the chunked-prefill budget (max_num_batched_tokens): it bounds "
                   "how much prompt one step may carry, and here it lets thousands of tokens in. The cache "
                   "has room and nothing is preempted, so it is not cache pressure, and TTFT is as before, "
                   "so requests are not queueing. "),
        "load": ("Requests fast alone but slow under load, with the wait before the first token and the "
                 "waiting queue growing, are queueing: more requests arrive than the engines admit. The "
                 "cache stays under half full and nothing is preempted, so it is not cache pressure, and the "
                 "decode steps and their gaps are as before, so long prompts are not stalling the streams in "
                 "mixed steps. Compare the arrival rate with what the fleet serves (and what max_num_seqs "
                 "admits), then add replicas or raise the limit where the TPOT allows. "),
    }[kind] + {
        "cache": "Kernels come last: the steps take their usual time, so no kernel got slower.",
        "budget": ("Kernels come last: the steps without prompt tokens take their usual time, so no kernel "
                   "got slower; the slow steps are slow because of what they carry."),
        "load": "Kernels come last: the steps take their usual time, so no kernel got slower.",
    }[kind]
    return {"q9_symptoms": symptoms, **_marks("q9", ("budget", "cache", "load"), kind), "q9_why": repr(why)}


def q10_step_ms() -> dict[str, float]:
    """Q10's step times (ms), priced by the course's cost model (minengine.perf.roofline, the simulator's):
    Llama-3.1-8B in bf16 on one H100 SXM, 64 streams decoding at 2K context, alone or in one step with a
    whole 8,000-token prompt, 16,384 prompt tokens, or a 512-token chunk of a prompt 4,096 tokens in."""
    from minengine.perf.roofline import CostModel

    cost = CostModel.create("llama-3.1-8b", "h100-sxm", dtype="bf16")
    decodes = [(1, 2047)] * 64
    return {name: 1e3 * cost.step_time(decodes + extra)
            for name, extra in (("decode", []), ("prompt_8k", [(8000, 0)]), ("budget_16k", [(16384, 0)]),
                                ("chunk_512", [(512, 4096)]))}


def _next_step(rng: random.Random) -> dict:
    """Q10: the fix for stalls in mixed steps follows from what is already in place: chunked prefill off
    (turn it on), on with a huge budget (lower it), on with a small budget and TTFT at its SLO (split)."""
    kind = rng.choice(["chunk", "budget", "split"])
    ms = {name: round(t, -1) if t > 100 else t for name, t in q10_step_ms().items()}  # 247.5 -> 250
    decode = f"{ms['decode']:.0f} ms"
    setup = {
        "chunk": (f"runs with chunked prefill **off**. Its p99 ITL is {ms['prompt_8k']:.0f} ms against a "
                  f"median of {decode}; the slow gaps come in the steps that also carry a whole "
                  f"8,000-token prompt, which take about {ms['prompt_8k'] / ms['decode']:.0f} times longer "
                  "than the others. TTFT meets its SLO with room to spare."),
        "budget": ("runs with chunked prefill on and `max_num_batched_tokens = 16384`. Its p99 ITL is "
                   f"{ms['budget_16k']:.0f} ms against a median of {decode}; the slow gaps come in the steps "
                   "that carry up to 16,384 tokens of a long prompt, which take about "
                   f"{ms['budget_16k'] / ms['decode']:.0f} times longer than the others. TTFT meets its SLO "
                   "with room to spare."),
        "split": ("runs with chunked prefill on and `max_num_batched_tokens = 512`, under a tight TPOT SLO "
                  f"of {ms['decode'] * 1.25:.0f} ms that a tenth of the requests miss: their streams share "
                  f"many steps with 512-token prompt chunks, which take about {ms['chunk_512']:.0f} ms "
                  f"against {decode} for the others. The long prompts' p99 TTFT is already at its SLO. The "
                  "GPUs share a fast fabric."),
    }[kind] + (" (Llama-3.1-8B in bf16 on H100s, 64 streams decoding: step times from the course's cost "
               "model.)")
    why = {
        "chunk": ("The slow gaps sit in steps that hold a whole long prompt next to the decodes, and every "
                  "decoding stream waits for each of them. Chunked prefill with a token budget bounds every "
                  "step (lesson 06), which removes most of that tail at the cost of a slightly longer TTFT "
                  "for the long prompts, which has room. With chunking off a prompt is never split across "
                  "steps, so lowering the budget alone cannot shorten those steps (minengine then refuses a "
                  "budget below max_model_len, so that every prompt fits in one step). Disaggregation is the "
                  "step after, worth its operational cost only if a tight TPOT still breaks. "),
        "budget": ("Chunked prefill is on, but a 16,384-token budget lets a step carry thousands of prompt "
                   "tokens, and every decoding stream waits for each such step. Lower the budget (to a few "
                   "hundred or a couple of thousand tokens): each step then carries at most that much "
                   "prompt, which removes most of the tail at the cost of a longer TTFT for the long "
                   "prompts, which has room. Chunking is already on, so turning it on changes nothing, "
                   "and disaggregation is worth its operational cost only once a small budget still breaks "
                   "a tight TPOT. "),
        "split": ("Chunking is on and the budget is already small (512 tokens), yet a 10 ms TPOT still "
                  "breaks in the steps that carry a chunk. A smaller budget would push the long prompts' "
                  "TTFT past its SLO, which it already sits at (lesson 06: a smaller budget lengthens the "
                  "long prompt's TTFT). This is where separate prefill and decode pools pay: the decode "
                  "steps stay pure, and on a fast fabric the KV cache crosses quickly. Chunked prefill is "
                  "already on, so turning it on is no step. "),
    }[kind] + ("More GPUs do not shorten a slow step: its length is the prompt tokens it computes, not the "
               "few decoding streams it also carries.")
    return {"q10_setup": setup, **_marks("q10", ("chunk", "budget", "split"), kind), "q10_why": repr(why)}


def params(seed: int) -> dict:
    rng = random.Random(f"quiz5_final/{seed}")
    return {**_kv_transfer(rng), **_concurrency(rng), **_kv_use(rng), **_token_cost(rng),
            **_long_answers(rng), **_split_or_not(rng), **_place_chips(rng), **_benchmark_plan(rng),
            **_prompt_statistic(rng), **_diagnosis_stage(rng), **_where_to_look(rng), **_next_step(rng)}
