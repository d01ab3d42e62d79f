"""``AsyncLLM``: stream tokens per request from one engine shared by many asyncio clients.

A background task runs engine steps back to back while requests are unfinished. Each step runs in a
single worker thread (``run_in_executor``) so the event loop stays free to accept requests and send
tokens while the model computes. Every engine call (add, step, abort) goes through that same
one-thread executor, so they run one after another and the engine needs no locks: an add or an abort
waits at most for the step in flight, then takes effect (an abort frees the KV blocks right there).

    llm = AsyncLLM(model="tinystories-4m")
    async for out in llm.generate("Once upon a time", SamplingParams(max_tokens=32), "req-1"):
        print(out.outputs[0].delta_text, end="")   # out.time: when the token was sampled

Cancelling the consumer (a client disconnect closes the stream) aborts the request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from minengine.core.request import Request
from minengine.core.sampling_params import SamplingParams
from minengine.engine.llm_engine import LLMEngine, PromptType
from minengine.engine.outputs import RequestOutput

T = TypeVar("T")


class AsyncLLM:
    """``AsyncLLM(model=None, **engine_options)`` (same options as ``LLM``), or ``AsyncLLM(engine=...)``."""

    def __init__(
        self,
        model: Any = None,
        *,
        engine: LLMEngine | None = None,
        tokenizer: Any = None,
        **engine_options: Any,
    ) -> None:
        self._owns_engine = engine is None
        self.engine = (
            engine if engine is not None else LLMEngine(model=model, tokenizer=tokenizer, **engine_options)
        )
        # The worker thread gets the caller's torch thread count (a new thread would start from the default).
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="minengine-step",
            initializer=torch.set_num_threads,
            initargs=(torch.get_num_threads(),),
        )
        self._queues: dict[str, asyncio.Queue[RequestOutput | BaseException]] = {}
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._error: BaseException | None = None
        self._next_id = 0

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    async def generate(
        self, prompt: PromptType, sampling_params: SamplingParams | None = None, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield a ``RequestOutput`` for every new token (``outputs[0].delta_text`` is the new text)."""
        if self._stopping:
            raise RuntimeError("AsyncLLM was shut down")
        if self._error is not None:
            raise RuntimeError("the engine loop failed earlier") from self._error
        if request_id is None:
            request_id, self._next_id = f"async-{self._next_id}", self._next_id + 1
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in use")
        arrival = time.perf_counter()
        queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            await self._call(self._add, request_id, prompt, sampling_params, arrival)
            self._ensure_loop()
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise RuntimeError("the engine loop failed") from item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:  # the consumer stopped early (cancelled, closed, or an error): abort
                self._abort_in_background(request_id)

    async def abort(self, request_id: str) -> None:
        """Abort a request; when this returns its KV blocks are free and its stream has ended."""
        outputs = await self._call(self.engine.abort_request, request_id)
        for out in outputs:
            self._deliver(out)
        self._queues.pop(request_id, None)

    async def shutdown(self) -> None:
        """Stop the loop after the step in flight, abort what is left, release the worker thread."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        unfinished = list(self.engine.scheduler.requests)
        if unfinished:
            for out in await self._call(self.engine.abort_request, unfinished):
                self._deliver(out)
        self._executor.shutdown(wait=True)
        if self._owns_engine:  # an engine handed in belongs to the caller, who closes it
            self.engine.close()

    # ---- internals ----
    def _add(
        self, request_id: str, prompt: PromptType, params: SamplingParams | None, arrival: float
    ) -> Request:
        """Runs on the worker thread, between steps."""
        return self.engine.add_processed_request(
            self.engine.process_inputs(request_id, prompt, params, arrival)
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _ensure_loop(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(
                self._run(), name="minengine-engine-loop"
            )

    @property
    def error(self) -> BaseException | None:
        """The exception that stopped the engine loop, if any (the engine is then dead, as in vLLM)."""
        return self._error

    async def _run(self) -> None:
        assert self._wake is not None
        try:
            while not self._stopping:
                self._wake.clear()  # clear *before* looking, so an add that lands now still wakes us
                if not self.engine.has_unfinished_requests():
                    await self._wake.wait()
                    continue
                for out in await self._call(self.engine.step):
                    self._deliver(out)
        except Exception as e:  # a bug or a device error: fail every stream instead of hanging it
            self._error = e
            for queue in self._queues.values():
                queue.put_nowait(e)
            self._queues.clear()
            raise

    def _deliver(self, out: RequestOutput) -> None:
        queue = self._queues.get(out.request_id)
        if queue is not None:
            queue.put_nowait(out)
            if out.finished:
                del self._queues[out.request_id]

    def _abort_in_background(self, request_id: str) -> None:
        try:
            future = asyncio.get_running_loop().run_in_executor(
                self._executor, self.engine.abort_request, request_id
            )
        except RuntimeError:  # no running loop (generator finalised late) or executor shut down
            self._queues.pop(request_id, None)
            return
        future.add_done_callback(lambda _: self._queues.pop(request_id, None))
