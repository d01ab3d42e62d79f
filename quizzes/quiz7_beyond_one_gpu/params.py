"""Quiz 7's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws the sizes of the six numeric questions and computes their keys, tolerances and
explanations, with lesson 11's formulas:

- a ring all-reduce of B tokens x hidden values over t GPUs sends 2 (t - 1) / t of the message on every
  GPU, after a fixed latency (Patarasuk and Yuan 2009; the cost model's ``all_reduce_cost``);
- a TP replica's KV cache: each GPU keeps u x memory minus its 1/t of the weights for its 1/t of every
  token's K/V (``sim.simulator.kv_cache_blocks``, the activation reserve left out);
- a pipeline: one batch crosses p stages in turn (p stage times plus p - 1 hand-overs), and m < p streams
  keep each stage busy m / p of the time (``sim.pipeline``);
- MoE: n tokens, each picking k of E experts uniformly, touch E (1 - (1 - k/E)^n) of them;
- cost per million output tokens: the fleet's hour over the output tokens it makes in it, times the share
  of GPU time generation took (``perf.prices.token_costs``).

For the multiple-choice questions it draws a scenario (Q2 which machine runs TP = 2, Q4 what the layout
must achieve, Q8 the batch of the MoE model, Q10 what pipeline stages should buy, Q11 how DeepSeek-V3 is
placed) and marks the option it makes right (``* [@@q2_cpu@@]``), so
another course's answer sheet is no key.
"""

from __future__ import annotations

import random

from minengine.course.templating import option_marks as _marks

HIDDEN = 8192  # Llama-2-70B
KV_BYTES_PER_TOKEN = 2 * 80 * 8 * 128 * 2  # K and V, 80 layers, 8 KV heads of 128, bf16: 327,680 bytes
LINKS = {"nvlink": ("NVLink 4", 450e9), "pcie": ("PCIe Gen5 x16", 64e9)}  # bytes/s each way (datasheets)


def _all_reduce(rng: random.Random) -> dict:
    t = rng.choice([4, 8])  # at t = 2 the ring's share is the whole message, so no formula is told apart
    tokens = rng.choice([64, 256, 1024])
    latency_us = rng.choice([5, 10, 20])
    link = rng.choice(sorted(LINKS))
    name, bandwidth = LINKS[link]
    message = tokens * HIDDEN * 2
    wire = 2 * (t - 1) / t * message
    key = round(latency_us + 1e6 * wire / bandwidth, 2)
    naive = round(latency_us + 1e6 * message / bandwidth, 2)
    tol = round(max(0.02 * key, 0.1), 2)
    return {
        "q1_t": str(t), "q1_tokens": str(tokens), "q1_latency": str(latency_us), "q1_link": name,
        "q1_bw": f"{bandwidth / 1e9:g}", "q1_key": key, "q1_tol": tol, "q1_tol_text": f"{tol:g}",
        "q1_naive": naive,
        "q1_why": (f"The message is {tokens} tokens x {HIDDEN} values x 2 bytes = {message:,} bytes. "
                   "In a ring "
                   f"each GPU sends (and receives) 2 (t - 1) / t of it: {t - 1} chunks of 1/{t} in the "
                   f"reduce-scatter and {t - 1} more in the all-gather, {wire:,.0f} bytes, which take "
                   f"{1e6 * wire / bandwidth:.2f} us at {bandwidth / 1e9:g} GB/s; add the {latency_us} us of "
                   f"latency: {key:g} us. Sending the whole message once ({naive:g} us) is neither what one "
                   "GPU sends nor what the ring costs. At one token's message the latency is nearly all of "
                   "it, which is why the tax is largest where steps are shortest."),
    }


def _tp_machine(rng: random.Random) -> dict:
    """Q2: what TP = 2 does to a decode step depends on the machine: one CPU, NVLink, or PCIe at a big
    batch."""
    kind = rng.choice(["cpu", "nvlink", "pcie"])
    machine = {
        "cpu": "a small model, from TP = 1 to TP = 2 on one 2-core CPU, as two processes (gloo), at batch 1",
        "nvlink": "Llama-2-70B in bf16, from TP = 2 to TP = 4 on H100 SXM GPUs joined by NVLink, at batch 1",
        "pcie": ("from TP = 4 to TP = 8 on eight H100 PCIe cards with no NVLink (PCIe Gen5 between them), "
                 "at a batch of 512"),
    }[kind]
    why = {
        "cpu": ("On one CPU both ranks read from the same memory through the same cores that one process "
                "used, so splitting the weights splits no bandwidth: the weight read takes as long as "
                "before. On top, the ranks meet twice per layer in an all-reduce that crosses processes "
                "through the operating system, far slower than the tiny step's matmuls. No faster, usually "
                "slower: on a 2-core AMD EPYC the course measured a 100M model's batch-1 step at 2.7x the "
                "TP = 1 one, with the same tokens (benchmarks/RESULTS.md, tensor parallelism)."),
        "nvlink": ("Each GPU reads its half of the weights from its own memory at full bandwidth, so the "
                   "bandwidth-bound step's weight read halves. What does not halve is small: the 2 x layers "
                   "all-reduces, each about its fixed ~10 us at one token's message, and the per-step "
                   "overhead. Lesson 11's cost model gives Llama-2-70B's batch-1 step 29.9 ms at TP 2 and "
                   "16.0 ms at TP 4: 1.87x, nearly, not quite, twice. (A small model gains less: an 8B's "
                   "fixed costs are a larger share of its short step, 1.57x from TP 1 to TP 2.)"),
        "pcie": ("At batch 512 each all-reduce carries 512 tokens x hidden values, two per layer, and over "
                 "PCIe, seven times slower than NVLink, those bytes take about half of the TP 8 step "
                 "(lesson 11's curve: 52 %). The weight read still halves, but the communication that "
                 "comes with the wider split eats most of the gain: the cost model gives 1.36x for doubling "
                 "the GPUs. That is why TP stays inside an NVLink domain."),
    }[kind]
    return {"q2_machine": machine, **_marks("q2", ("cpu", "nvlink", "pcie"), kind), "q2_why": repr(why)}


def _kv_tokens(rng: random.Random) -> dict:
    while True:
        t = rng.choice([2, 4, 8])
        u = rng.choice([0.85, 0.9, 0.95])
        budget = u * 80e9 - 140e9 / t
        if budget > 1e9:
            break
    per_token = KV_BYTES_PER_TOKEN / t
    key = round(budget / per_token / 1e3, 1)
    unsplit = round(budget / KV_BYTES_PER_TOKEN / 1e3, 1)
    tol = round(0.02 * key, 1)
    return {
        "q3_t": str(t), "q3_u": f"{u:g}", "q3_key": key, "q3_tol": tol, "q3_tol_text": f"{tol:g}",
        "q3_unsplit": unsplit,
        "q3_why": (f"Each GPU may use {u:g} x 80 GB = {u * 80:g} GB and holds 1/{t} of the 140 GB of "
                   "weights, "
                   f"{140 / t:g} GB, which leaves {budget / 1e9:g} GB for the cache. It keeps the K and V of "
                   f"its {8 // t} of the 8 KV heads for every token: {KV_BYTES_PER_TOKEN:,} / {t} = "
                   f"{per_token:,.0f} bytes a token. So {budget / 1e9:g} GB / {per_token:,.0f} B = "
                   f"{key:g} thousand tokens, the same on every GPU of the replica. Dividing by a whole "
                   f"token's {KV_BYTES_PER_TOKEN:,} bytes ({unsplit:g} thousand) forgets that each GPU keeps "
                   "only its heads. A wider split leaves much more cache: the weights shrink per GPU while "
                   "the memory does not, which is why lesson 11's TP 2 replicas ran short of room."),
    }


def _layout(rng: random.Random) -> dict:
    """Q4: eight GPUs as four TP 2, two TP 4 or one TP 8 replica: which wins depends on the goal."""
    kind = rng.choice(["loose", "tight", "cache"])
    goal = {
        "loose": "serve the most requests per second with 90 % of them within TTFT 1 s and TPOT 50 ms",
        "tight": "serve the most requests per second with 90 % of them within TTFT 1 s and TPOT 25 ms",
        "cache": "find which layout's replicas each hold the fewest tokens of KV cache",
    }[kind]
    right = {"loose": "tp4", "tight": "tp8", "cache": "tp2"}[kind]
    why = {
        "loose": ("Two TP 4 replicas. Each GPU of a TP 2 replica holds 69 GB of weights; with 0.9 of its 80 "
                  "GiB in use and about 2 GiB kept for activations, some 6 GB per GPU is left for KV: a "
                  "38-thousand-token cache, so small batches, queues and preemption under load. "
                  "TP 4 leaves each GPU most of its memory for cache and a token time (~16 ms) well inside "
                  "50 ms; TP 8's single replica is fastest per token but pays the largest all-reduce share "
                  "and has half the replicas, so it serves fewer requests within the loose SLO."),
        "tight": ("One TP 8 replica. A lone token takes ~30 ms at TP 2, above 25 ms before any load, so TP 2 "
                  "serves nothing within the SLO; TP 4's ~16 ms leaves little room as batches grow; TP 8's "
                  "~9 ms leaves the most. Tight latency SLOs are bought with wider TP, even though each GPU "
                  "then spends a larger share of its step on all-reduces."),
        "cache": ("The TP 2 replicas. Each GPU holds 1/t of the 140 GB of weights and keeps the rest of its "
                  "memory for its share of every token's K/V, so the cache grows fast with t: at 0.9 x 80 "
                  "GiB, less about 2 GiB for activations, a TP 2 GPU has some 6 GB left, a TP 4 one 41 GB. "
                  "The narrowest split is the one that runs out "
                  "of cache first, whatever its all-reduce savings."),
    }[kind]
    return {"q4_goal": goal, **_marks("q4", ("tp2", "tp4", "tp8"), right), "q4_why": repr(why)}


def _pipeline_tpot(rng: random.Random) -> dict:
    p = rng.choice([2, 4, 8])
    stage = rng.choice([2.5, 4.0, 7.5])
    hop = rng.choice([0.02, 0.05, 0.1])
    key = round(p * stage + (p - 1) * hop, 3)
    tol = round(0.02 * key, 3)
    return {
        "q5_p": str(p), "q5_stage": f"{stage:g}", "q5_hop": f"{hop:g}", "q5_key": key, "q5_tol": tol,
        "q5_tol_text": f"{tol:g}", "q5_stage_only": stage,
        "q5_why": (f"One stream's batch crosses the {p} stages one after another: {p} x {stage:g} ms of work "
                   f"plus {p - 1} hand-overs of {hop:g} ms, {key:g} ms per token. A pipeline does not run "
                   "one "
                   f"batch's stages at once (stage 2 needs stage 1's output), so its latency is about one "
                   "GPU's holding the whole model, plus the sends; with one stream each stage idles "
                   f"{p - 1} / {p} of the time. {stage:g} ms would be the time between two batches leaving "
                   "the pipeline when it is full, not one token's time."),
    }


def _pipeline_busy(rng: random.Random) -> dict:
    p = rng.choice([3, 4, 6, 8])
    m = rng.randrange(1, p)
    key = round(m / p, 3)
    return {
        "q6_p": str(p), "q6_m": str(m), "q6_key": key, "q6_tol": 0.01, "q6_tol_text": "0.01",
        "q6_why": (f"Each stream's next step can start only after its last left the last stage, so at most "
                   f"{m} batches are in flight, one per stream, each in one stage at a time: {m} of the "
                   f"{p} stages work at any moment, a share {m}/{p} = {key:g} (lesson 11's simulator gives "
                   f"25 % for one stream on 4 stages). The other {p - m}/{p} is the bubble; {p} or more "
                   "streams fill it."),
    }


def _experts(rng: random.Random) -> dict:
    while True:  # a case where the batch has not yet touched (nearly) every expert
        e = rng.choice([8, 16, 64, 128])
        k = rng.choice([k for k in (1, 2, 4, 8) if k < e // 2])
        n = rng.choice([4, 8, 16, 32])
        key = round(e * (1 - (1 - k / e) ** n), 2)
        if key < 0.95 * e:
            break
    tol = round(max(0.01 * key, 0.05), 2)
    return {
        "q7_e": str(e), "q7_k": str(k), "q7_n": str(n), "q7_key": key, "q7_tol": tol,
        "q7_tol_text": f"{tol:g}",
        "q7_why": (f"One token misses a given expert with chance 1 - {k}/{e}; {n} tokens, routed "
                   f"independently, all miss it with chance (1 - {k}/{e})^{n} = {(1 - k / e) ** n:.4f}. "
                   "So an "
                   f"expert is touched with chance {1 - (1 - k / e) ** n:.4f}, and {e} experts give "
                   f"{key:g} expected. {min(n * k, e)} (n x k, capped at E) would count the same expert "
                   "twice when two tokens share it. Real routers are skewed and touch fewer."),
    }


def _moe_batch(rng: random.Random) -> dict:
    """Q8: Mixtral's decode step at batch 1 reads about its active share; at batch 64 all of it."""
    kind = rng.choice(["b1", "b64"])
    batch = {"b1": "one request at a time (batch 1)", "b64": "a batch of 64 requests"}[kind]
    why = {
        "b1": ("One token uses 2 of the 8 experts in each layer, so the step reads about the 12.9 B active "
               "parameters and skips the other six experts' weights: lesson 11 prices it at about a third "
               "of a dense 46.7 B model's step. Decode at batch 1 is bound by the bytes it reads, so the "
               "experts it does not touch cost nothing. All experts stay resident, though: the memory is "
               "a 47B's."),
        "b64": ("64 tokens, each picking 2 of 8 experts, touch all 8 in practically every layer (8 x (1 - "
                "(6/8)^64) = 8.0), so the step reads all 46.7 B parameters, as a dense model of that size "
                "would: lesson 11's model gives the two steps within a few percent. Each token still "
                "multiplies through only 12.9 B, so the arithmetic stays smaller, but at this batch the step "
                "is bound by the bytes, and those are the whole model's."),
    }[kind]
    return {"q8_batch": batch, **_marks("q8", ("b1", "b64"), kind), "q8_why": repr(why)}


def _cost(rng: random.Random) -> dict:
    gpus = rng.choice([1, 2, 4, 8])
    price = rng.choice([2.0, 3.99, 6.88])
    rate = rng.choice([2, 5, 10, 20])
    out = rng.choice([128, 256, 512])
    share = rng.choice([0.1, 0.2, 0.3, 0.4])
    per_request = gpus * price / (3600 * rate)
    key = round(per_request * (1 - share) / out * 1e6, 3)
    whole = round(per_request / out * 1e6, 3)
    tol = round(max(0.01 * key, 0.001), 3)
    return {
        "q9_gpus": str(gpus), "q9_price": f"{price:g}", "q9_rate": str(rate), "q9_out": str(out),
        "q9_share": f"{100 * share:g}", "q9_key": key, "q9_tol": tol, "q9_tol_text": f"{tol:g}",
        "q9_whole": whole,
        "q9_why": (f"An hour of the fleet costs {gpus} x ${price:g} = ${gpus * price:g} and serves "
                   f"{rate} x 3600 = {rate * 3600:,} requests: ${per_request:.6f} a request. Generation took "
                   f"{100 - 100 * share:g} % of the GPU time, so its share is "
                   f"${per_request * (1 - share):.6f}, spread over {out} output tokens: x 10^6 / {out} = "
                   f"${key:g} per million. Charging the whole "
                   f"hour to the output tokens (${whole:g}) would bill the prompts' work twice once input "
                   "tokens are priced too. The load sold at is the SLO's: an idle hour is paid all the "
                   "same."),
    }


def _pipeline_goal(rng: random.Random) -> dict:
    """Q10: adding pipeline stages buys memory and a cheap way across slow links, never a faster token."""
    kind = rng.choice(["latency", "capacity", "crosslink"])
    goal = {
        "latency": "halve the time of each output token in their single-user demo",
        "capacity": "hold twice as many long conversations at once without preempting any",
        "crosslink": ("grow to two servers joined only by 400 Gb/s InfiniBand, without a TP split whose "
                      "all-reduces would cross that link"),
    }[kind]
    why = {
        "latency": ("A pipeline runs one batch's stages one after the other (stage 2 needs stage 1's "
                    "output), so a lone request's token still takes the time of all 80 layers, plus a "
                    "hand-over between the stages: about the same, a little worse. Each stage idles half "
                    "the time with one stream. What cuts a token's time is splitting every layer (more TP), "
                    "which reads each GPU's share of the weights at once."),
        "capacity": ("Each GPU now holds half the layers: half the weights and half of every token's K/V, "
                     "so the memory left for cache grows and far more tokens fit (in the course's "
                     "simulator, 256 requests of 1,024 + 256 tokens run without preemption at TP 2 x PP 2, "
                     "not at TP 2). With two or more "
                     "streams the two stages are both kept busy, so the extra conversations cost no "
                     "bubble; a single one would not run faster."),
        "crosslink": ("Between the stages only one hidden state and residual per token cross the link at "
                      "each step, once; TP across the two servers would send two all-reduces per layer, 160 "
                      "per step for a 70B, over the slow link. That is why deployments keep TP inside a "
                      "node (NVLink) and put pipeline stages, or separate replicas, across nodes."),
    }[kind]
    return {"q10_goal": goal, **_marks("q10", ("latency", "capacity", "crosslink"), kind),
            "q10_why": repr(why)}


def _deepseek(rng: random.Random) -> dict:
    """Q11: what a DeepSeek-V3 decode step pays for depends on how its experts are placed and the batch."""
    kind = rng.choice(["alone", "few", "spread"])
    how = {
        "alone": "on eight H200s in one server, to one user at a time (batch 1)",
        "few": "on eight H200s in one server, at a batch of 128",
        "spread": ("with its experts spread one per GPU over 320 GPUs in 40 servers, as its report deploys "
                   "decoding, at a large batch"),
    }[kind]
    why = {
        "alone": ("One token uses 8 of each layer's 256 routed experts plus the shared expert and the "
                  "attention: about 37 B parameters, 37 GB in FP8, read once for one token. The other "
                  "experts stay in memory untouched, so the step costs about what a dense 37B's would, far "
                  "less than the 671 GB resident."),
        "few": ("128 tokens, each picking 8 of 256 experts, touch nearly all of them in every layer "
                "(256 x (1 - (248/256)^128) = about 252), so on one server the step reads nearly all 671 GB "
                "of weights, as a dense model of that size would: the MoE saving is gone at this batch."),
        "spread": ("With one expert per GPU, each GPU reads only its own expert's weights, for every token "
                   "routed to it: an efficient matmul at a healthy batch. What is left is moving the tokens: "
                   "each MoE layer sends every token's hidden state to the GPUs of its 8 routed experts (and "
                   "the shared one) and the results back, about 10 MB per token per step, between servers "
                   "over InfiniBand: in lesson 11's cost model, a batch of 256 takes tens of milliseconds "
                   "of it a step against about a millisecond to read its expert. The report notes that "
                   "attention takes a larger share of decoding's time than of prefill's, and plans to hide "
                   "the transfers behind a second micro-batch's attention."),
    }[kind]
    return {"q11_how": how, **_marks("q11", ("alone", "few", "spread"), kind), "q11_why": repr(why)}


def params(seed: int) -> dict:
    rng = random.Random(f"quiz7_beyond_one_gpu/{seed}")
    return {**_all_reduce(rng), **_tp_machine(rng), **_kv_tokens(rng), **_layout(rng), **_pipeline_tpot(rng),
            **_pipeline_busy(rng), **_experts(rng), **_moe_batch(rng), **_cost(rng), **_pipeline_goal(rng),
            **_deepseek(rng)}
