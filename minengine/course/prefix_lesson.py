"""Lesson 07's measurements: prefix-cache hits, TTFT and KV use for prompts built different ways.

Every experiment of the lesson is "send these prompts, one after another or together, and read the
engine's own counters" (the StepRecords' prefill tokens, prefix-cache lookups and hits and KV blocks,
each RequestRecord's TTFT and cached tokens). The loops that send them are in the notebook, in sight;
:class:`PrefixRun` sums what they recorded, ``run_one_by_one`` is the same loop for the widget, and
``run_together`` sends a workload with arrival times. ``expected_hit_tokens`` is the prefix cache's rule
written out by hand, so the lesson can hold the measured hits against it.
``ASSISTANT_SYSTEM`` and ``chat_prompts`` give the real model (SmolLM2) a deployed assistant's system
prompt through its chat template, whose own tokens come before the system message (``show_tokens``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from minengine.core.records import RequestRecord, StepRecord
from minengine.core.sampling_params import SamplingParams
from minengine.course.lessons import WorkRequest, run_requests
from minengine.course.real_model_lesson import chat_prompt

# A system prompt of rules, the kind an assistant carries in front of every conversation.
RULES = (
    "You are Pip, a friendly helper who tells short stories to children.",
    "Always answer in simple words that a five year old can follow.",
    "Keep every story kind: nobody gets hurt, and every problem is solved by the end.",
    "Use the names of the children in the question when you can.",
    "If a child is sad, say something warm before the story starts.",
    "Stories happen in a park, a garden, a kitchen, a school or near the sea.",
    "Animals may talk, but they stay polite and they help each other.",
    "Never ask a child for an address, a school name or a phone number.",
    "End each story with one happy sentence and a small lesson about sharing or trying again.",
)


def system_prompt(tokenizer: Any, min_tokens: int = 1000) -> str:
    """Numbered rules, cycled until the text is at least ``min_tokens`` tokens long."""
    lines: list[str] = []
    i = 0
    while True:
        lines.append(f"Rule {i + 1}: {RULES[i % len(RULES)]}")
        text = "\n".join(lines) + "\n"
        if len(tokenizer.encode(text)) >= min_tokens:
            return text
        i += 1


def expected_hit_tokens(cached: Sequence[int], prompt: Sequence[int], block_size: int) -> int:
    """Prompt tokens the prefix cache can serve for ``prompt`` when ``cached`` was computed before.

    Only whole blocks are cached, a block is named by its tokens *and* every block before it (so the
    first differing token ends the match), and the prompt's last token is always computed (its logits
    are needed): hits = whole blocks of the common prefix, at most (len(prompt) - 1) // block_size.
    """
    common = first_difference(cached, prompt)
    return min(common // block_size, (len(prompt) - 1) // block_size) * block_size


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Index of the first position where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass
class PrefixRun:
    """What a batch of prompts cost: the engine's counters over the run's steps and requests."""

    requests: list[RequestRecord]
    steps: list[StepRecord]
    queries: int  # prompt tokens looked up in the prefix cache
    hits: int  # of which found there

    @classmethod
    def of(cls, requests: Sequence[RequestRecord], steps: Sequence[StepRecord]) -> PrefixRun:
        """The run these records make: the cache's lookups and hits summed over its steps."""
        return cls(list(requests), list(steps), sum(s.prefix_cache_queries for s in steps),
                   sum(s.prefix_cache_hits for s in steps))

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens the model actually computed (recomputation after a preemption included)."""
        return sum(s.num_prefill_tokens for s in self.steps)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.num_prompt_tokens for r in self.requests)

    @property
    def ttfts(self) -> list[float]:
        return [r.ttft for r in self.requests if r.ttft is not None]

    @property
    def median_ttft(self) -> float:
        return statistics.median(self.ttfts)

    @property
    def itls(self) -> list[float]:
        return [gap for r in self.requests for gap in r.itls]

    @property
    def median_itl(self) -> float:
        return statistics.median(self.itls) if self.itls else float("nan")

    @property
    def peak_kv_blocks(self) -> int:
        return max((s.kv_blocks_used for s in self.steps), default=0)

    @property
    def cached_tokens(self) -> list[int]:
        return [r.num_cached_tokens for r in self.requests]

    @property
    def num_preemptions(self) -> int:
        return sum(r.num_preemptions for r in self.requests)


def run_one_by_one(llm: Any, prompts: Sequence[str | Sequence[int]], params: SamplingParams,
                   reset: bool = True) -> PrefixRun:
    """Lesson 07's ``one_by_one`` loop (the notebook shows it), for the widget and the tests: each prompt
    sent after the previous one finished, as turns of a chat or users a second apart would; ``reset``
    empties the prefix cache first, so runs don't share it. ``llm`` is an ``LLM``."""
    if reset:
        llm.llm_engine.scheduler.block_manager.reset_prefix_cache()
    requests: list[RequestRecord] = []
    steps: list[StepRecord] = []
    for prompt in prompts:
        llm.generate([prompt], params, use_tqdm=False)
        requests += llm.request_records
        steps += llm.step_records
    return PrefixRun.of(requests, steps)


def run_together(llm: Any, work: Sequence[WorkRequest], reset: bool = True) -> PrefixRun:
    """Run a workload (arrival times and params per request) in one go; ``reset`` as above."""
    engine = getattr(llm, "llm_engine", llm)
    if reset:
        engine.scheduler.block_manager.reset_prefix_cache()
    run = run_requests(engine, work)
    return PrefixRun.of(run.requests, run.steps)


NAMES = ("Mia", "Sam", "Lily", "Ben", "Zoe", "Max", "Ava", "Leo", "Ruby", "Tom", "Nora", "Finn")
PLACES = ("park", "garden", "kitchen", "school", "beach", "forest", "farm", "library", "lake", "hill")
THINGS = ("red kite", "blue ball", "small boat", "yellow hat", "big box", "green frog", "old map",
          "shiny key", "soft cake", "paper star")


def documents(n: int = 10, sentences: int = 6) -> list[str]:
    """``n`` short made-up documents (a retrieval corpus for the lesson), each about one place."""
    docs = []
    for i in range(n):
        name, place = NAMES[i % len(NAMES)], PLACES[i % len(PLACES)]
        lines = [f"Note {i + 1}, about the {place}:"]
        for j in range(sentences):
            who, thing = NAMES[(i + j + 1) % len(NAMES)], THINGS[(i * 3 + j) % len(THINGS)]
            lines.append(f"{name} and {who} found a {thing} at the {place} and gave it to a friend.")
        docs.append(" ".join(lines) + "\n")
    return docs


def rag_prompt(system: str, docs: Sequence[str], question: str) -> str:
    """System prompt, then the documents in the order given, then the question (what changes last)."""
    return system + "".join(docs) + "Child: " + question + "\nPip:"


# A deployed assistant's system prompt (written for the course; the company is made up): who it is, what it
# knows, how it answers. Several hundred tokens, the same in front of every conversation.
ASSISTANT_SYSTEM = (
    "You are Juno, the support assistant of Larkfield Cloud, a company that stores files for small "
    "businesses and families. You answer questions from customers in the chat window of our website.\n\n"
    "What you know about the service:\n"
    "- Plans: Free (5 GB, one user), Home (200 GB, up to five people, 4 euros a month) and Team "
    "(2 TB shared, up to fifty users, 9 euros per user a month). Yearly billing saves two months.\n"
    "- Files deleted by a user stay in the Bin for 30 days on Home and Team, 7 days on Free, and can be "
    "restored from there. After that they are gone for good.\n"
    "- Every file keeps its earlier versions for 90 days on Team and 30 days on Home. Free keeps none.\n"
    "- A single upload can be up to 50 GB from the desktop app and 5 GB from the browser.\n"
    "- Files are encrypted in transit and at rest. Team plans can turn on two-step sign-in for everyone.\n"
    "- Folders can be shared by link (view only or edit) or with named people. Links can expire.\n"
    "- Customers can cancel at any time under Settings, Billing. The plan stays active to the end of "
    "the period already paid, then the account becomes Free. Nothing is deleted, but uploads stop "
    "while the account holds more than 5 GB.\n"
    "- Support by email answers within one working day; Team customers can also book a phone call.\n\n"
    "How you answer:\n"
    "1. Be friendly, short and concrete: two to four sentences unless the customer asks for steps.\n"
    "2. When you give steps, number them and name the buttons exactly as they appear in the app.\n"
    "3. Only state facts from the list above. If you do not know, say so and offer the email support.\n"
    "4. Never ask for a password, a full card number or a one-time code, and tell the customer to "
    "ignore anyone who does.\n"
    "5. Do not promise refunds, discounts or dates; a person from the billing team decides those.\n"
    "6. If a customer is upset, acknowledge it in one sentence before you answer.\n"
    "7. Answer in the language the customer writes in.\n"
    "8. End with one short question that checks the problem is solved, for example: Did that help?"
)
SUPPORT_QUESTIONS = (
    "How much does the Team plan cost for 12 people?",
    "I deleted a folder two weeks ago. Can I still get it back?",
    "What is the biggest file I can upload from my browser?",
    "How do I share a folder with my accountant?",
    "If I cancel, do I lose my photos?",
    "Are my files encrypted?",
)


def chat_prompts(tokenizer: Any, system: str, questions: Sequence[str]) -> list[str]:
    """One prompt per question, each the system prompt and the question through the model's chat template."""
    return [chat_prompt(tokenizer, q, system=system) for q in questions]


def show_tokens(tokenizer: Any, ids: Sequence[int], mark: int | None = None) -> str:
    """Token ids with their text, ``id:'text'``, separated by spaces; ``mark`` puts ``>>`` before one
    index."""
    parts = []
    for i, t in enumerate(ids):
        piece = tokenizer.decode([t])
        parts.append(f"{'>>' if i == mark else ''}{t}:{piece!r}")
    return " ".join(parts)
