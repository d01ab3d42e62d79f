"""The real-model helpers of lessons 00 and 07: chat prompts through each model's template, a streamed reply's
timings, the two-model comparison, and lesson 07's real system prompt (its hits, and the date that breaks
them)."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace

import pytest

import minengine
from minengine.course import lessons as lu
from minengine.course import prefix_lesson as pl
from minengine.course import real_model_lesson as rl


@pytest.fixture(scope="module")
def tiny_tok():
    return minengine.load_tokenizer()


@pytest.fixture(scope="module")
def real_tok():
    if not lu.real_model_installed():
        pytest.skip("SmolLM2's package is not installed (make installs it)")
    return minengine.load_tokenizer(lu.REAL_MODEL)


class NoTemplate:
    chat_template = None


def test_chat_prompt_uses_the_template_and_falls_back_to_plain_text(tiny_tok):
    assert rl.has_chat_template(tiny_tok) and not rl.has_chat_template(NoTemplate())
    assert rl.chat_prompt(tiny_tok, "Why?") == "<|user|>\nWhy?\n<|assistant|>\n"
    with_all = rl.chat_prompt(tiny_tok, "Why?", context="Some notes.\n", system="Be kind.")
    assert with_all == "<|system|>\nBe kind.\n<|user|>\nSome notes.\n\nWhy?\n<|assistant|>\n"
    plain = rl.chat_prompt(NoTemplate(), "Why?", context=" Notes. ", system="Be kind.")
    assert plain == "Be kind.\n\nNotes.\n\nWhy?\nAnswer:"


def test_smollm2_template_adds_its_default_system_message_only_without_one(real_tok):
    bare = rl.chat_prompt(real_tok, rl.SHORT_QUESTION)
    assert bare.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert bare.endswith(f"<|im_start|>user\n{rl.SHORT_QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    own = rl.chat_prompt(real_tok, rl.SHORT_QUESTION, system="You are Juno.")
    assert own.startswith("<|im_start|>system\nYou are Juno.<|im_end|>") and "SmolLM" not in own


def test_the_notes_fit_both_models_and_make_a_long_prompt(tiny_tok, real_tok):
    real_len = len(real_tok.encode(rl.chat_prompt(real_tok, rl.QUESTION, context=rl.SERVING_NOTES)))
    tiny_len = len(tiny_tok.encode(rl.chat_prompt(tiny_tok, rl.QUESTION, context=rl.SERVING_NOTES)))
    assert 400 <= real_len <= 900  # long enough for a visible pause, short enough for the 2-minute budget
    assert tiny_len + 120 <= 2048  # the fallback (tiny model, 2,048 positions) still fits, with its answer


def test_stream_reply_collects_every_piece_with_the_engine_timings(torch_one_thread):
    llm = minengine.AsyncLLM(kv_cache_memory_bytes=16 * 2**20)
    shown: list[str] = []
    params = minengine.SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)

    async def run():
        try:
            return await rl.stream_reply(llm, "Once upon a time", params, show=shown.append)
        finally:
            await llm.shutdown()

    reply = asyncio.run(run())
    assert reply.output.finished and reply.num_output_tokens == 12 and len(reply.pieces) == 12
    assert reply.text == "".join(shown) == reply.output.outputs[0].text
    assert reply.num_prompt_tokens == len(reply.output.prompt_token_ids) > 0
    assert reply.ttft > 0 and len(reply.itls) == 11 and all(g >= 0 for g in reply.itls)
    assert reply.ttft_per_prompt_token == pytest.approx(reply.ttft / reply.num_prompt_tokens)
    times = [t for t, _ in reply.pieces]
    assert times == sorted(times) and times[0] == pytest.approx(reply.output.record.token_times[0])


def test_engine_weight_bytes_counts_every_parameter_once(torch_one_thread):
    model = minengine.load_model()
    expected = lu.weight_bytes(model)
    assert rl.engine_weight_bytes(minengine.LLM(model, num_blocks=16)) == expected
    assert rl.engine_weight_bytes(minengine.AsyncLLM(model, num_blocks=16)) == expected
    assert 10e6 < expected < 20e6  # 3.5M fp32 parameters


def fake_reply(prompt_tokens: int, ttft: float, itls: list[float]) -> rl.StreamedReply:
    record = SimpleNamespace(ttft=ttft, itls=itls)
    out = SimpleNamespace(prompt_token_ids=[0] * prompt_tokens, outputs=[SimpleNamespace(token_ids=[0] * 3)],
                          record=record)
    return rl.StreamedReply(out)


def test_model_comparison_ratios_and_table():
    small_long, small_short = fake_reply(1000, 0.1, [0.004]), fake_reply(10, 0.01, [0.002, 0.001, 0.003])
    big_long, big_short = fake_reply(500, 1.5, [0.05]), fake_reply(30, 0.2, [0.04, 0.06, 0.05])
    c = rl.ModelComparison(small_long, small_short, big_long, big_short, 14_000_000, 538_000_000)
    assert c.bytes_ratio == pytest.approx(538 / 14)
    assert c.ttft_ratio == pytest.approx((1.5 / 500) / (0.1 / 1000))  # per prompt token: 30x
    assert c.itl_ratio == pytest.approx(0.05 / 0.002)  # medians of the short replies: 25x
    table = c.table("tiny", "real")
    assert "38.4x" in table and "30.0x" in table and "25.0x" in table and "real" in table.splitlines()[0]


def test_assistant_system_prompt_is_several_hundred_real_tokens_and_shared(real_tok):
    assert 400 <= len(real_tok.encode(pl.ASSISTANT_SYSTEM)) <= 700
    prompts = pl.chat_prompts(real_tok, pl.ASSISTANT_SYSTEM, pl.SUPPORT_QUESTIONS)
    ids = [real_tok.encode(p) for p in prompts]
    assert len(ids) == len(pl.SUPPORT_QUESTIONS) >= 4
    assert ids[0][:3] == real_tok.encode("<|im_start|>system\n")  # the template's tokens come first
    shared = min(pl.first_difference(ids[0], other) for other in ids[1:])
    assert shared >= len(real_tok.encode(pl.ASSISTANT_SYSTEM))  # the system message, then the user's turn
    assert all(pl.expected_hit_tokens(ids[0], other, 16) >= 480 for other in ids[1:])


def test_a_date_at_the_front_breaks_the_chain_in_an_early_block(real_tok):
    def dated(i):
        return f"Current date and time: 2025-03-14 10:31:{i:02d}.\n"

    q = pl.SUPPORT_QUESTIONS[0]
    front = [real_tok.encode(rl.chat_prompt(real_tok, q, system=dated(i) + pl.ASSISTANT_SYSTEM))
             for i in (0, 1)]
    back = [real_tok.encode(rl.chat_prompt(real_tok, q, system=pl.ASSISTANT_SYSTEM + "\n\n" + dated(i)))
            for i in (0, 1)]
    assert pl.expected_hit_tokens(*front, 16) <= 32
    assert pl.expected_hit_tokens(*back, 16) >= 480


def test_show_tokens_names_each_id_and_marks_one(tiny_tok):
    ids = tiny_tok.encode("Once upon a time")
    text = pl.show_tokens(tiny_tok, ids, mark=1)
    named = re.findall(r"(>>)?(\d+):'", text)
    assert [int(i) for _, i in named] == ids and [m for m, _ in named] == ["", ">>", "", ""]
    assert pl.show_tokens(tiny_tok, tiny_tok.encode("a\nb")).count("'\\n'") == 1  # a newline shows as \n


def test_chat_prompts_hit_the_rule_in_the_engine(torch_one_thread, tiny_tok):
    # The tiny model through its own chat template: the engine's hits follow the block rule exactly.
    system = pl.system_prompt(tiny_tok, min_tokens=200)
    prompts = pl.chat_prompts(tiny_tok, system, ["Tell a story.", "Why is the sky blue?", "Who is Mia?"])
    llm = minengine.LLM(minengine.load_model(), tokenizer=tiny_tok, num_blocks=64)
    run = pl.run_one_by_one(llm, prompts, minengine.SamplingParams(max_tokens=2, ignore_eos=True))
    ids = [tiny_tok.encode(p) for p in prompts]
    assert run.cached_tokens == [0] + [pl.expected_hit_tokens(ids[0], other, 16) for other in ids[1:]]
    assert min(run.cached_tokens[1:]) >= 192
