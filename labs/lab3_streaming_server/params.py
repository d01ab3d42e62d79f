"""Lab 3's hidden requests for one course seed (instructor-only: params.py never reaches the release).

The server is graded against the reference server's live answers, so there are no expected values
here: only which prompts, lengths, delays and bad requests this course's hidden tests send. The pools
were checked on the shipped models: the UTF-8 prompts make SmolLM2-135M answer (greedily, 8 tokens) with
characters whose bytes span several tokens; the disconnect prompts make tinystories-4m write ~100 tokens
or more before it stops, so a client leaving after the first few is still mid-stream.
"""

from __future__ import annotations

import json
import random
from typing import Any

MODEL = "tinystories-4m"
OPENERS = ["Once upon a time", "Tom and his dog", "One day, a little girl named Lily",
           "The sun was shining and", "Max had a big red ball", "In a small town there lived",
           "Sam wanted to fly a kite", "Mia found a box", "The bird sang a song",
           "Ben and Anna went to the beach", "There was a tall tree", "A little fish swam"]
LONG_STORIES = ["Once upon a time", "Tom and his dog", "One day, a little girl named Lily",
                "Max had a big red ball", "In a small town there lived",
                "Sam wanted to fly a kite"]  # 99-144 tokens before they stop
CHAT = ["Tell me a story about a dog.", "Write a story about a brave girl.", "Tell me about a little boat.",
        "Can you tell me a story about the moon?", "Write a short story about two friends."]
# KV blocks one request may hold (16 tokens each on the shipped models): 576-1,024 tokens, always room for
# the disconnect test's 400 tokens and always below tinystories-4m's 2,048-token context, so a server that
# caps only at the context (the package's own) admits requests this class's server must refuse.
KV_BLOCKS_CHOICES = (36, 40, 44, 48, 52, 56, 60, 64)
UTF8 = ["Say good morning in Japanese.", "Say hello in Korean.", "Write 'cat' in Japanese.",
        "Say goodbye in Japanese.", "Write the word love in Chinese."]


def _bad_requests(rng: random.Random) -> list[dict[str, Any]]:
    """One of each kind the lab lists, with this course's values, in this course's order."""
    chat, done = "/v1/chat/completions", "/v1/completions"
    prompt = rng.choice(OPENERS)
    user = [{"role": "user", "content": rng.choice(CHAT)}]
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 8})
    cases = [
        {"path": rng.choice([done, chat]), "raw": body[: rng.randint(5, len(body) - 2)],
         "why": "a body cut short"},
        {"path": done, "body": {"model": MODEL, "prompt": prompt, "max_tokens": -rng.randint(1, 100)},
         "why": "a negative max_tokens"},
        {"path": done,
         "body": {"model": MODEL, "prompt": prompt, "max_tokens": rng.choice(["ten", "8 tokens", [8]])},
         "why": "a max_tokens that is not a number"},
        {"path": chat, "body": {"model": MODEL, "messages": user, "max_tokens": rng.randint(3000, 100_000)},
         "why": "max_tokens beyond the context"},
        {"path": done, "body": {"model": MODEL, "prompt": "word " * rng.randint(2100, 4000), "max_tokens": 4},
         "why": "a prompt longer than the context"},
        {"path": rng.choice([done, chat]), "body": {"model": MODEL, "prompt": prompt, "messages": user,
                                                    "temperature": -round(rng.uniform(0.1, 3), 2)},
         "why": "a negative temperature"},
        {"path": chat, "body": {"model": MODEL, "messages": [{"role": rng.choice(["wizard", "robot", ""]),
                                                              "content": "hi"}]},
         "why": "a message with a role that does not exist"},
        {"path": chat,
         "body": {"model": MODEL, "messages": [{"role": "user", "content": rng.choice([None, 42])}]},
         "why": "a message without text content"},
        {"path": chat, "body": {"model": MODEL}, "why": "no messages at all"},
        {"path": rng.choice([done, chat]), "body": {"model": f"gpt-{rng.randint(2, 9)}", "prompt": prompt,
                                                    "messages": user},
         "why": "a model this server does not serve"},
        {"path": done, "body": {"model": MODEL, "prompt": prompt, "stream_options": {"include_usage": True}},
         "why": "stream_options without stream"},
    ]
    rng.shuffle(cases)
    return cases


def params(seed: int) -> dict[str, Any]:
    rng = random.Random(f"lab3_streaming_server/{seed}")
    openers = rng.sample(OPENERS, len(OPENERS))
    return {
        "completion_prompts": openers[:2],
        "chat_prompts": rng.sample(CHAT, 2),
        "sse_prompt": openers[2],
        "sse_max_tokens": rng.randint(8, 24),
        "utf8_prompts": rng.sample(UTF8, 1),
        "stream_prompt": rng.choice(LONG_STORIES),
        "stream_delay": rng.choice([0.04, 0.05, 0.06]),
        "concurrent_prompts": [f"{rng.choice(OPENERS)}, {rng.choice(['and', 'but', 'so'])} {i}"
                               for i in range(32)],
        "disconnect_prompt": rng.choice(LONG_STORIES),
        "bad_requests": _bad_requests(rng),
        "client_prompt": rng.choice(LONG_STORIES),
        "client_max_tokens": rng.randint(12, 24),
        # drawn last, so the earlier cells' values stay what they were for a class already released
        "load_prompts": [f"{rng.choice(OPENERS)}, {rng.choice(['and', 'but', 'so'])} {i}"
                         for i in range(rng.randint(6, 10))],
        "load_max_tokens": rng.randint(8, 16),
        # drawn after those, for the same reason: the class's KV budget per request (part 1, a rule the
        # package's own server does not have) and the prompt its hidden test sends at and past it
        "kv_blocks_per_request": rng.choice(KV_BLOCKS_CHOICES),
        "kv_budget_prompt": rng.choice(OPENERS + CHAT),
    }
