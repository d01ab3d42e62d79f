"""AsyncLLM: concurrent streams, timestamps, abort, client disconnect (plain asyncio.run, no plugin)."""

from __future__ import annotations

import asyncio
import time

import pytest
from hf_utils import byte_tokenizer

from minengine.core.request import RequestStatus
from minengine.core.sampling_params import SamplingParams
from minengine.engine.async_llm import AsyncLLM
from minengine.engine.llm import LLM
from minengine.engine.llm_engine import LLMEngine
from minengine.models.loader import load_model

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[(7 * i + 13 * j) % 500 + 3 for j in range(5 + 9 * i)] for i in range(6)]



@pytest.fixture(scope="module")
def model(hf_model_dir):
    return load_model(hf_model_dir("llama"), device="cpu")


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


async def collect(stream) -> list:
    return [out async for out in stream]


def test_concurrent_streams_match_offline_generation(model, tokenizer):
    lengths = [8, 12, 16, 20, 24, 28]

    async def main():
        llm = AsyncLLM(engine=LLMEngine(model=model, tokenizer=tokenizer, max_num_batched_tokens=32))
        ticks = 0

        async def ticker():  # the event loop must stay free while steps run in the worker thread
            nonlocal ticks
            while True:
                await asyncio.sleep(0.002)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        streams = [
            llm.generate(p, greedy(n), f"r{i}") for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))
        ]
        results = await asyncio.gather(*(collect(s) for s in streams))
        tick_task.cancel()
        await llm.shutdown()
        return results, ticks

    results, ticks = asyncio.run(main())
    offline = LLM(model, tokenizer=tokenizer).generate(PROMPTS, [greedy(n) for n in lengths], use_tqdm=False)
    assert ticks > 5
    for outs, ref, n in zip(results, offline, lengths, strict=True):
        assert len(outs) == n and outs[-1].finished and not any(o.finished for o in outs[:-1])
        times = [o.time for o in outs]
        assert times == sorted(times) and len(set(times)) == n, "one output per token, in time order"
        assert [t for o in outs for t in o.outputs[0].delta_token_ids] == outs[-1].outputs[0].token_ids
        assert "".join(o.outputs[0].delta_text for o in outs) == outs[-1].outputs[0].text
        assert outs[-1].outputs[0].token_ids == ref.outputs[0].token_ids
        assert outs[-1].outputs[0].text == ref.outputs[0].text
        assert outs[-1].record.token_times == times
    # the streams overlapped: every request had its first token before any request finished
    assert max(r[0].time for r in results) < min(r[-1].time for r in results)


def test_abort_frees_blocks_at_once_and_ends_the_stream(model):
    async def main():
        engine = LLMEngine(model=model)
        llm = AsyncLLM(engine=engine)
        stream = llm.generate(PROMPTS[3], greedy(200), "a")
        other = asyncio.create_task(collect(llm.generate(PROMPTS[1], greedy(30), "b")))
        first = await stream.__anext__()
        request = engine.scheduler.requests["a"]
        assert request.block_table and not first.finished
        await llm.abort("a")
        assert request.status == RequestStatus.FINISHED_ABORTED and request.block_table == []
        assert "a" not in engine.scheduler.requests
        rest = await collect(stream)
        assert rest and rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        b_outs = await other
        assert b_outs[-1].outputs[0].finish_reason == "length" and len(b_outs) == 30
        usage = engine.kv_cache_usage
        await llm.shutdown()
        return usage

    assert asyncio.run(main()) == 0


def test_cancelled_or_closed_consumer_aborts_its_request(model):
    async def main():
        engine = LLMEngine(model=model)
        llm = AsyncLLM(engine=engine)
        got_token = asyncio.Event()

        async def slow_client():
            async for _ in llm.generate(PROMPTS[2], greedy(500), "cancelled"):
                got_token.set()
                await asyncio.sleep(10)  # the client stalls; then it disconnects (cancel)

        task = asyncio.create_task(slow_client())
        await got_token.wait()
        cancelled = engine.scheduler.requests["cancelled"]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

        async for _ in llm.generate(PROMPTS[4], greedy(500), "closed"):
            break  # leaving the loop closes the generator: also a disconnect
        closed = engine.scheduler.requests.get("closed")

        deadline = time.perf_counter() + 10
        while engine.has_unfinished_requests() and time.perf_counter() < deadline:
            await asyncio.sleep(0.01)
        await llm.shutdown()
        return engine, cancelled, closed

    engine, cancelled, closed = asyncio.run(main())
    assert cancelled.finish_reason == "abort" and cancelled.num_output_tokens < 500
    assert closed is None or closed.finish_reason == "abort"
    assert not engine.has_unfinished_requests() and engine.kv_cache_usage == 0


def test_bad_requests_raise_in_the_caller(model):
    async def main():
        llm = AsyncLLM(engine=LLMEngine(model=model))
        with pytest.raises(ValueError, match="no tokenizer"):
            await collect(llm.generate("text needs a tokenizer", greedy(4)))
        stream = llm.generate(PROMPTS[0], greedy(3), "dup")
        first = await stream.__anext__()
        with pytest.raises(ValueError, match="already in use"):
            await collect(llm.generate(PROMPTS[0], greedy(3), "dup"))
        rest = await collect(stream)
        await llm.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            await collect(llm.generate(PROMPTS[0], greedy(3)))
        return [first, *rest]

    outs = asyncio.run(main())
    assert len(outs) == 3 and outs[-1].finished
