"""Quiz 4's numbers per course seed (instructor-only: the release never contains this file).

``params(seed)`` draws a prompt template for the prefix-cache question (Q1: system prompt length,
a per-request line, the question) and a retrieval setup for the top-k question (Q5: prefill speed,
documents, question), and computes their keys, tolerances and explanations. For the multiple-choice
questions it draws a scenario (Q2 where a system prompt is edited, Q3 whether a shared manual opens the
prompt, Q4 a fleet's routing, its prompt layout or its size, Q6 long answers, long prompts or a low
sequence cap, Q7 a network delay or a buffering proxy, Q8 a server that aborts or keeps abandoned
requests, Q9 which half of a split character, Q10 the rate the product needs) and marks the option it
makes right (``* [@@q2_start@@]``), so another course's answer sheet is no key. Strings go into the
question text, numbers into the hidden tests.
"""

from __future__ import annotations

import random

from minengine.course.templating import option_marks as _marks

BLOCK = 16


def _prefix_hit(rng: random.Random) -> dict:
    system = BLOCK * rng.randrange(60, 190) + rng.randrange(8, 16)  # ends 8-15 tokens into a block
    stamp = rng.choice([10, 12, 14, 18])
    question = rng.randrange(24, 90)
    total = system + stamp + question
    cached = system // BLOCK * BLOCK
    key = total - cached
    return {
        "q1_system": f"{system:,}",
        "q1_stamp": str(stamp),
        "q1_question": str(question),
        "q1_key": key,
        "q1_total": total,
        "q1_unblocked": stamp + question,
        "q1_tol": 2,
        "q1_tol_text": "2",
        "q1_why": (f"In the new layout every request starts with the same {system:,} system-prompt tokens, "
                   f"so the second request finds the first one's blocks in the cache, but only whole blocks: "
                   f"{system:,} // {BLOCK} = {system // BLOCK} full blocks, {cached:,} tokens. The last "
                   f"{system - cached} system-prompt tokens share a block with the time line, which differs, "
                   f"so that block misses. It prefills {total:,} - {cached:,} = {key} tokens: "
                   f"{system - cached} of the system prompt, {stamp} of the time line and {question} of the "
                   f"question. With the time line in front, the very first block already differed, and since "
                   f"each block's hash includes the one before it, nothing matched: all {total:,} tokens. "
                   f"Counting only the time line and the question ({stamp + question}) forgets that the "
                   f"cache works in blocks."),
    }


def _top_k(rng: random.Random) -> dict:
    speed = rng.choice([6000, 8000, 10000, 12000, 16000])  # prefill tokens per second
    system_blocks = rng.randrange(40, 120)
    system = system_blocks * BLOCK
    docs_all = rng.choice([15, 20, 25])
    k = rng.choice([3, 4, 5])
    doc = rng.choice([300, 350, 400, 500, 600])
    question = rng.randrange(30, 80)
    tokens = k * doc + question
    key = round(1000 * tokens / speed, 1)
    with_system = round(1000 * (system + tokens) / speed, 1)
    all_docs = round(1000 * (docs_all * doc + question) / speed, 1)
    tol = round(0.03 * key, 1)
    return {
        "q5_speed": f"{speed:,}",
        "q5_system": f"{system:,}",
        "q5_blocks": str(system_blocks),
        "q5_all": str(docs_all),
        "q5_k": str(k),
        "q5_doc": str(doc),
        "q5_question": str(question),
        "q5_key": key,
        "q5_with_system": with_system,
        "q5_all_docs": all_docs,
        "q5_tol": tol,
        "q5_tol_text": f"{tol:g}",
        "q5_why": (f"The system prompt fills exactly {system_blocks} blocks and is the same for everyone, so "
                   f"it comes from the prefix cache. The documents differ from question to question, so "
                   f"everything from the first document on is computed: {k} x {doc} + {question} = "
                   f"{tokens:,} tokens at {speed:,} tokens/s, {key:g} ms. With all {docs_all} documents the "
                   f"same request would prefill {docs_all * doc + question:,} tokens ({all_docs:g} ms) and "
                   f"hold their KV cache for as long as it runs, which lowers how many requests fit at once. "
                   f"Counting the system prompt too ({with_system:g} ms) forgets the cache, which is why the "
                   f"stable part goes first and the documents after it."),
    }



Q2_PROMPT = 3000  # tokens of the old system prompt; its last partial block was never cached


def _prompt_edit(rng: random.Random) -> dict:
    """Q2: how much of an edited system prompt the cache still serves depends on where the edit is."""
    kind = rng.choice(["middle", "start", "end"])
    at = rng.randrange(40, 140) * 10  # the edited word's token position, in the middle
    full = Q2_PROMPT // BLOCK * BLOCK
    change = {
        "middle": (f"one word in a rule near token {at:,} changes, and the rest of the text stays exactly as "
                   "it was"),
        "start": ("its first line, the assistant's name, gets one more word, and the rest of the text stays "
                  "exactly as it was"),
        "end": ("a new rule is added at its end, on a line of its own, and the 3,000 tokens before it stay "
                "exactly as they were"),
    }[kind]
    why = {
        "middle": (f"The lookup walks the blocks in order and stops at the first miss: the whole blocks "
                   f"before the edit (about {at:,} tokens) are reused, the block holding it misses, and "
                   f"every later block misses too, because its parent differs, however identical its own "
                   f"text. (The first differing token can sit a little before the edited word, as the "
                   f"tokenizer may merge it with its neighbours.) "),
        "start": ("The edit is in the first block, so the first block misses, and every later block misses "
                  "too, because its hash includes its parent's, however identical its own text: none of the "
                  "system prompt is reused, and all 3,000 tokens are computed again. "),
        "end": (f"Every token of the old prompt is still there, in the same place, so every whole block of "
                f"it still matches: {Q2_PROMPT:,} // {BLOCK} = {Q2_PROMPT // BLOCK} blocks, {full:,} tokens. "
                f"The last {Q2_PROMPT - full} old tokens shared a block with what followed them (the user's "
                f"message), which now differs, so that block misses: only those {Q2_PROMPT - full} tokens "
                "and the new rule are computed, then the request's own text. "),
    }[kind] + ("A block's name is a hash of its tokens and of the block before it, so a block matches only "
               "if the whole prompt up to its end is identical. There is no per-block lookup of the blocks "
               "after a miss and no similarity: the cache matches exact token ids, and only whole blocks. "
               "An edit near the end of a long system prompt costs little; an edit near the start costs all "
               "of it, which is why what changes goes last.")
    return {"q2_change": change, "q2_at": f"{at:,}", "q2_full": f"{full:,}",
            **_marks("q2", ("middle", "start", "end"), kind), "q2_why": repr(why)}


def _manual_hits(rng: random.Random) -> dict:
    """Q3: a shared manual hits only when it opens the prompt; a per-user line in front stops every hit."""
    kind = rng.choice(["hits", "misses"])
    layout = {
        "hits": "the same 6,000-token manual followed by the user's question (about 50 tokens)",
        "misses": ("a line with the user's name and plan (about 20 tokens), then the same 6,000-token "
                   "manual, then the user's question (about 50 tokens; most users ask one question a day)"),
    }[kind]
    why = {
        "hits": ("The manual opens every prompt, so a request finds the manual's blocks in the cache and "
                 "computes only its ~50-token question: TTFT falls to a small share of what it was (which on "
                 "a busy server also frees compute for others' prefills). "),
        "misses": ("The cache matches blocks from the start of the prompt, and each block's hash includes "
                   "the one before it. Here the first block holds the user's own line, so it differs from "
                   "user to user, and every later block misses with it, manual and all: the hit rate stays "
                   "near zero (only a user's own later questions could hit, and most users ask one), every "
                   "request prefills all ~6,070 tokens as before, and neither TTFT nor ITL moves. Putting "
                   "the user's line after the manual would fix it. "),
    }[kind] + ("Decode is untouched by caching either way: every step reads the weights and the sequence's "
               "whole KV cache, cached tokens included, since attention looks at every earlier token, so "
               "ITL stays where it was. Shared blocks can save memory while several requests use them at "
               "once, but they are still in each request's block table and read at each step.")
    return {"q3_layout": layout, **_marks("q3", ("hits", "misses"), kind), "q3_why": repr(why)}


def _tenant_routing(rng: random.Random) -> dict:
    """Q4: round-robin scatters the tenants' prefixes, a per-request line in front hides them, too few
    replicas leave each cache too many tenants. Which one a fleet suffers from, the seed decides."""
    kind = rng.choice(["routing", "layout", "replicas"])
    setup = {
        "routing": ("Eight replicas behind a round-robin load balancer serve 40 tenants; each tenant's "
                    "requests start with its own 4,000-token prompt, followed by the user's message. Beside "
                    "the running requests, a replica's cache keeps about 10 such prefixes. The prefix-cache "
                    "hit rate is 30 %"),
        "layout": ("Eight replicas serve 40 tenants behind a router that sends each tenant's requests to the "
                   "replica that served it last (about 5 tenants each). Each request starts with a line "
                   "giving its request id and time, then the tenant's own 4,000-token prompt, then the "
                   "user's message. Beside the running requests, a replica's cache keeps about 10 such "
                   "prefixes. The prefix-cache hit rate is under 1 %"),
        "replicas": ("Two replicas serve 40 tenants behind a router that sends each tenant's requests to the "
                     "replica that served it last (about 20 tenants each); each tenant's requests start with "
                     "its own 4,000-token prompt, followed by the user's message. Beside the running "
                     "requests, a replica's cache keeps about 10 such prefixes. The prefix-cache hit rate "
                     "is 45 %"),
    }[kind]
    why = {
        "routing": ("Each replica has its own cache. Round-robin sends every tenant to every replica, so "
                    "each replica sees all 40 prefixes in turn with room for about 10: they keep evicting "
                    "one another before they are used again. Routing by prefix gives each replica about 5 "
                    "tenants, which fit, so nearly every request after a tenant's first one hits. More "
                    "replicas under round-robin change nothing for one replica: it still sees all 40. The "
                    "prompts already start with what is shared, so reordering them changes nothing. "),
        "layout": ("The routing is already right: about 5 tenants per replica fit in its cache. But every "
                   "prompt starts with its own id and time, so its first block differs from every other "
                   "request's, and since each block's hash includes the one before it, the tenant's 4,000 "
                   "tokens after it never match. Moving that line after the tenant's prompt lets every "
                   "request of a tenant reuse its 250 blocks. More replicas would not make a first block "
                   "that differs match. "),
        "replicas": ("The routing is already by tenant and the prompts start with what is shared, so the "
                     "problem is room: each replica serves about 20 tenants and keeps about 10 prefixes, so "
                     "they evict one another. Under the same router, eight replicas give each about 5 "
                     "tenants, which fit, and nearly every request after a tenant's first one hits (more "
                     "KV memory per replica, or a smaller KV dtype, would do the same). "),
    }[kind] + ("Smaller blocks recover at most a block's worth of a prefix (under 16 tokens of 4,000), and "
               "do nothing for a first block that differs. The price of prefix-aware routing is balance (a "
               "hot tenant piles onto one replica), which is why such routers fall back past a load gap.")
    return {"q4_setup": setup, **_marks("q4", ("routing", "layout", "replicas"), kind), "q4_why": repr(why)}


def _report_requests(rng: random.Random) -> dict:
    """Q6: long answers hold KV and cause preemptions, long prompts stall the steps, a low sequence cap
    queues requests while the cache sits idle. The symptoms, drawn here, decide the fix."""
    kind = rng.choice(["answers", "prompts", "slots"])
    setup = {
        "answers": ('a few "write the full report" requests, whose `max_tokens` is the model\'s 32K context. '
                    "While a report is being written, the chat requests' TTFT and E2E jump, and "
                    "`vllm:num_preemptions` climbs"),
        "prompts": ('a few "summarise this report" requests, whose prompts are about 30,000 tokens long and '
                    "whose answers are short. Chunked prefill is on, with `max_num_batched_tokens` at "
                    "16,384. Each time such a request arrives, the running chats' inter-token latency jumps "
                    "for a couple of steps, while `vllm:num_preemptions` stays at 0"),
        "slots": ('a few "write the full report" requests, whose answers are capped at 2,000 tokens; '
                  "`max_num_seqs` is 16. At busy hours the chats' TTFT jumps while their inter-token latency "
                  "stays low: `vllm:num_requests_running` sits at 16, `vllm:num_requests_waiting` climbs, "
                  "`vllm:kv_cache_usage_perc` stays near 0.3 and `vllm:num_preemptions` at 0"),
    }[kind]
    why = {
        "answers": ("A request's KV cache grows by one token per step for as long as it runs. A report "
                    "allowed 32K tokens ends up holding a large part of a modest cache, and when a running "
                    "request needs a block and none is free, the newest running requests (the chats that "
                    "arrived after it) are preempted and recomputed later: their TTFT and E2E jump and the "
                    "preemption counter climbs. Capping max_tokens to what a use needs bounds what one "
                    "request can hold (lesson 07, section 7). The reports' prompts are not the problem, so "
                    "smaller prefill chunks do not help, and more sequences would only compete for the same "
                    "full cache. "),
        "prompts": ("No request is preempted, so memory is not the problem, and the answers are short "
                    "anyway, so capping max_tokens changes nothing. The jump is the prefill: each step holds "
                    "up to 16,384 tokens, so the report's prompt rides in two huge chunks, and every running "
                    "chat waits for those steps to get its next token (lesson 06). A budget of a couple of "
                    "thousand tokens cuts the prompt into smaller chunks: each step is short, the chats' "
                    "gaps stay small, and the report's TTFT grows a little. More sequences would not shorten "
                    "a step. "),
        "slots": ("The requests wait for a slot, not for memory: 16 are running (the cap), more queue, and "
                  "the cache is 70 % free with no preemption. Raising max_num_seqs lets more of them run at "
                  "once, which on a GPU costs each step little while the batch is small (decode is "
                  "memory-bound), so the chats' TTFT falls and their ITL barely moves; watch the cache use "
                  "and the preemption counter as the cap goes up. The answers are already capped and nothing "
                  "is preempted, so a tighter max_tokens would free nothing the chats wait for, and the "
                  "steps are short (low ITL), so smaller prefill chunks do not help. "),
    }[kind] + "Prefix caching shares identical prompt prefixes, not one request's memory with another's."
    return {"q6_setup": setup, **_marks("q6", ("answers", "prompts", "slots"), kind), "q6_why": repr(why)}


def _stream_delay(rng: random.Random) -> dict:
    """Q7: a client's TTFT a little above the server's is the network; one near the whole answer's time is
    a proxy buffering the stream. Which the team sees, the seed decides."""
    kind = rng.choice(["network", "buffered"])
    client = {"network": 310, "buffered": 4100}[kind]
    why = {
        "network": ("A client measures from sending to the first content chunk, so its TTFT includes the "
                    "network both ways, the proxy, and the server's HTTP parsing and tokenisation, which the "
                    "engine's histogram (it starts when the engine receives the request) cannot see: the 170 "
                    "ms here. 310 ms is far below the time a whole answer takes, so the chunks do flow as "
                    "they are made. "),
        "buffered": ("The client's first chunk arrives after 4.1 s, about when a whole answer is done, while "
                     "the server sent its first token after 140 ms: something between them (typically a "
                     "proxy that buffers responses) holds the chunks back until the stream ends, which turns "
                     "streaming off for the user. The gap is still outside the engine, and the fix is there "
                     "(turn buffering off for the streaming route). "),
    }[kind] + ("Streaming sends each token's text as an SSE event as soon as it is decoded; the engine runs "
               "the same steps at the same speed, so the last token leaves about when the whole answer used "
               "to. It makes nothing faster. The user waits for the client's number, so that is the one an "
               "SLO is about; the server's own histogram tells you how much of it the engine spends.")
    return {"q7_client": f"{client:,}", **_marks("q7", ("buffered",), kind), "q7_why": repr(why)}


def _disconnects(rng: random.Random) -> dict:
    """Q8: whether the server aborts requests whose client left shows on /metrics; the seed decides which."""
    kind = rng.choice(["kept", "aborted"])
    seen = {
        "kept": ("`vllm:num_requests_running` stays high and `vllm:kv_cache_usage_perc` stays near 1 until "
                 "each of those requests reaches its 2,000 tokens"),
        "aborted": ("`vllm:num_requests_running` and `vllm:kv_cache_usage_perc` drop within a second of each "
                    "disconnect, and `vllm:request_success_total{finished_reason=\"abort\"}` climbs by one "
                    "each time"),
    }[kind]
    why = {
        "kept": ("Here the requests keep running for up to 2,000 tokens each after their client left, so the "
                 "cache stays full and live requests queue or get preempted behind work nobody will read: "
                 "the server does not abort them. "),
        "aborted": ("Here the running count and the cache use drop at each disconnect and the abort counter "
                    "rises: the server notices the closed connection and aborts the request, and its blocks "
                    "and batch slot go to live requests. That is the behaviour to want. "),
    }[kind] + ("A disconnect shows up in the server as a closed connection (an ASGI disconnect, a failed "
               "write); the server should then abort the request in the engine, which frees its KV blocks "
               "and its place in the batch within a step or two, and counts it with finish reason abort. "
               "Aborting is routine for an engine (it is how stop strings and cancellations end requests "
               "too). Clients close streams all the time (a user closes the tab). And blocks a finished "
               "request leaves in the prefix cache are free to take (vLLM V1 counts them as free), and they "
               "hold no request in the running count.")
    return {"q8_seen": seen, **_marks("q8", ("kept", "aborted"), kind), "q8_why": repr(why)}


def _emoji_stream(rng: random.Random) -> dict:
    """Q9: what a streaming detokenizer sends for each half of a split character; the seed picks the half."""
    kind = rng.choice(["first", "second"])
    why = {
        "first": ("When the first token is decoded, the emoji has two of its four bytes: it holds them back "
                  "and sends no text for them yet; the emoji goes out whole with the next token. "),
        "second": ("When the second token is decoded, the two bytes it held back and this token's two make "
                   "the whole emoji, so it sends the emoji now, in this token's event. "),
    }[kind] + ("The stream carries text: each SSE event is JSON whose content is a string of whole "
               "characters, and two bytes of a four-byte character are not a character. Decoding them alone "
               "gives U+FFFD, which a client would show and keep (its text would then differ from the "
               "non-streamed answer). So the detokenizer decodes a small window of tokens and emits only "
               "text that does not end in an incomplete character. Raw bytes cannot travel in a JSON string, "
               "and decoding is one token per step: no token is known before its step.")
    return {"q9_which": kind, **_marks("q9", ("first", "second"), kind), "q9_why": repr(why)}


def _servers_needed(rng: random.Random) -> dict:
    """Q10: goodput from a rate sweep sizes the fleet; the product's need, drawn here, sets how many."""
    need = rng.choice([5, 7, 15])
    kind = {5: "one", 7: "two", 15: "three"}[need]
    why = ("Goodput, the requests per second that meet both SLOs, peaks at the knee of the sweep, about 5.8 "
           "requests/s at 6; past it the queue builds, TTFT blows through the SLO first (1.9 s p99 at 8), "
           "and goodput falls although the server works harder. So one server gives about 6 within the SLOs. "
           + {"one": "The product needs 5, so one server is enough, with a little room. ",
              "two": "The product needs 7, so it needs a second server (or cheaper requests). ",
              "three": "The product needs 15: two servers give about 12, so it needs three. "}[kind]
           + "DistServe's definition (the highest rate at which 90% meet both) also gives 6: at 8 requests/s "
           "only about 64% do. A median TPOT under its SLO says nothing about TTFT, and a median says "
           "nothing about the users in the tail. A closed-loop client slows down with the server, so it "
           "would hide the queueing (coordinated omission, lesson 03), not remove it.")
    return {"q10_need": str(need), **_marks("q10", ("one", "two", "three"), kind), "q10_why": repr(why)}


def seeded_choices(rng: random.Random) -> dict:
    """The multiple-choice questions' scenarios, drawn after the numeric questions' values."""
    return {**_prompt_edit(rng), **_manual_hits(rng), **_tenant_routing(rng), **_report_requests(rng),
            **_stream_delay(rng), **_disconnects(rng), **_emoji_stream(rng), **_servers_needed(rng)}


def params(seed: int) -> dict:
    rng = random.Random(f"quiz4_prefix_serving/{seed}")
    return {**_prefix_hit(rng), **_top_k(rng), **seeded_choices(rng)}
