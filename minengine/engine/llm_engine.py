"""``LLMEngine``: the front end around ``EngineCore``: turns prompts into requests, steps into outputs.

``EngineCore`` (torch-free, ``minengine.core``) owns the step loop: schedule -> ``ModelRunner``
(the executor: forward + sample) -> update -> ``StepRecord``. What is left here is what vLLM keeps
outside its core too: input processing (tokenize, validate) and output processing (detokenize, stop
strings, ``RequestOutput`` objects). Every request carries its ``RequestRecord`` (arrival, first
scheduled, each token, finish), every step its ``StepRecord``.
"""

from __future__ import annotations

import itertools
import json
import time
import weakref
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from minengine.config import EngineConfig
from minengine.core.engine_core import EngineCore
from minengine.core.records import RequestRecord, StepRecord
from minengine.core.request import Request
from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.core.scheduler import Scheduler
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.engine.kv_cache import PagedKVCache
from minengine.engine.model_runner import ModelRunner
from minengine.engine.outputs import CompletionOutput, RequestOutput
from minengine.engine.worker import RuntimeInfo, Worker
from minengine.models.errors import ModelNotFoundError
from minengine.models.loader import load_model, load_tokenizer

MAX_RECORDS = 100_000  # finished-request records kept by a long-running engine (a server)

PromptType = str | list[int] | dict[str, Any]
DELTA, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY


class LLMEngine:
    """Loads the model, sizes the KV cache, and runs steps over whatever requests were added.

    ``LLMEngine(EngineConfig(...))`` or ``LLMEngine(model="tinystories-4m", max_num_seqs=8)``; pass
    ``model=`` an already loaded ``LlamaForCausalLM`` (and ``tokenizer=``) to skip loading.
    """

    def __init__(
        self, config: EngineConfig | None = None, *, model: Any = None, tokenizer: Any = None, **kwargs: Any
    ) -> None:
        if isinstance(model, (str, Path)):
            kwargs["model"], model = str(model), None
        if config is None:
            config = EngineConfig.from_kwargs(**kwargs)
        elif kwargs:
            raise TypeError(
                f"pass either an EngineConfig or keyword options, not both (got {sorted(kwargs)})"
            )
        if model is None:
            model = load_model(config.model, dtype=config.dtype, device=config.device)
        self.model = model
        self.model_config = model.config
        self.device: torch.device = model.device
        self.dtype: torch.dtype = model.dtype
        self.config = config.resolved(self.model_config.max_position_embeddings)
        path = config.tokenizer or getattr(model, "model_path", None)
        self.tokenizer = tokenizer if tokenizer is not None else _try_load_tokenizer(path)
        self.eos_token_ids = _eos_token_ids(
            self.model_config, getattr(model, "model_path", None), self.tokenizer
        )

        # The device side (kernels, attention backend, KV cache, graphs) has one owner, which says what
        # it runs (``self.runtime``) and releases it all on ``close()``.
        self.worker = Worker(model, self.config)
        self.model = self.worker.model  # with tensor parallelism, rank 0's shard (the whole is not kept)
        self.kv_cache: PagedKVCache = self.worker.kv_cache
        self.model_runner: ModelRunner = self.worker.model_runner
        self.scheduler = Scheduler(self.config, self.worker.num_blocks)
        # The stop checker reaches this engine through a weak reference: a bound method would make a
        # cycle (engine -> core -> method -> engine) that only the cycle collector could free, and a
        # frozen heap (gc.freeze) never would.
        self.engine_core = EngineCore(
            self.scheduler, self.model_runner, clock=time.perf_counter, stop_checker=_weak_stop_checker(self)
        )

        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._ids = itertools.count()
        self.request_records: deque[RequestRecord] = deque(maxlen=MAX_RECORDS)  # finished requests

    # ---- requests ----
    def process_inputs(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        """Tokenize and validate a request without queueing it (raises ValueError if it cannot run)."""
        params = params if params is not None else SamplingParams()
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        text, ids = self._tokenize(prompt)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, and this model has none; use stop_token_ids")
        request = Request(
            request_id=str(next(self._ids)) if request_id is None else str(request_id),
            prompt_token_ids=ids,
            sampling_params=params,
            arrival_time=time.perf_counter() if arrival_time is None else arrival_time,
            prompt=text,
            eos_token_ids=self.eos_token_ids,
        )
        self.scheduler.check_request(request)
        return request

    def add_request(
        self,
        request_id: str | None,
        prompt: PromptType,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
    ) -> Request:
        """Queue a request; ``prompt`` is text, token ids, or {"prompt": ...} / {"prompt_token_ids": ...}."""
        return self.add_processed_request(self.process_inputs(request_id, prompt, params, arrival_time))

    def add_processed_request(self, request: Request) -> Request:
        self.engine_core.add_request(request)
        if self.tokenizer is not None:
            self._detokenizers[request.request_id] = IncrementalDetokenizer(
                self.tokenizer,
                request.prompt_token_ids,
                request.sampling_params.stop,  # type: ignore[arg-type]
            )
        return request

    def abort_request(self, request_ids: str | Iterable[str]) -> list[RequestOutput]:
        """Stop requests now and free their KV blocks; returns their final outputs (finish_reason "abort")."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        outputs = []
        for rid in ids:
            request = self.engine_core.abort_request(rid)
            if request is not None:
                outputs.append(self._make_output(request, [], time.perf_counter()))
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.scheduler.requests)

    # ---- the step ----
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns an output for each request that got a token or finished."""
        step = self.engine_core.step()
        if step is None:
            return []
        outputs = []
        for s in step.scheduler_output.scheduled:
            token = step.sampled_token_ids.get(s.request_id)
            if token is None:
                continue
            request = s.request
            if request.sampling_params.output_kind is FINAL_ONLY and not request.is_finished:
                continue  # nothing to build (and no output list to copy) until it finishes
            new_ids = token if type(token) is list else [token]  # a verified decode can keep several
            outputs.append(self._make_output(request, new_ids, request.record.token_times[-1]))
        return outputs

    def _check_stop_string(self, request: Request, finishing: bool) -> str | None:
        """EngineCore's stop checker: decode the request's newest token; the stop string it completes."""
        detok = self._detokenizers.get(request.request_id)
        if detok is None:
            return None
        stop = detok.update(request.token_ids[-1:])
        if stop is None and finishing:
            stop = detok.flush()  # the last bytes of an incomplete character may complete one
        return stop

    def _make_output(self, request: Request, new_ids: list[int], now: float) -> RequestOutput:
        finished = request.is_finished
        detok = self._detokenizers.get(request.request_id)
        cumulative = request.sampling_params.output_kind is not DELTA
        delta, text = "", ""
        if detok is not None:
            delta = detok.get_delta(finished)
            text = detok.emitted_text if cumulative else delta  # the whole text only when it is asked for
        if finished:
            self._detokenizers.pop(request.request_id, None)
            self.request_records.append(request.record)
        # DELTA: only what is new, no copy of the whole output (O(1) per step, not O(output length))
        token_ids = request.output_token_ids if cumulative else list(new_ids)
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=token_ids,
            finish_reason=request.finish_reason,
            stop_reason=request.stop_reason,
            delta_text=delta,
            delta_token_ids=list(new_ids),
        )
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            outputs=[completion],
            finished=finished,
            record=request.record,
            num_cached_tokens=request.num_cached_tokens,
            time=now,
        )

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                prompt = list(prompt["prompt_token_ids"])
            elif "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer: pass prompts as lists of token ids")
            return prompt, list(self.tokenizer.encode(prompt))
        ids = list(prompt)
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be ints in [0, {vocab}); got {bad[:5]}")
        return None, ids

    # ---- what runs, and the end of it ----
    @property
    def runtime(self) -> RuntimeInfo:
        """What this engine runs: attention backend, graphs, dtype, KV layout, and why (``Worker``)."""
        return self.worker.runtime

    @property
    def linear_kernel(self) -> Any:
        return self.worker.linear_kernel

    @property
    def small_op_kernels(self) -> bool:
        return self.worker.small_op_kernels

    @property
    def closed(self) -> bool:
        return self.worker.closed

    def close(self) -> None:
        """Abort what is unfinished, then free the device side: KV cache, graphs, compiled steps, buffers.
        The engine cannot run afterwards; ``del engine`` (with no ``close``) frees the same."""
        if self.worker.closed:
            return
        unfinished = list(self.scheduler.requests)
        if unfinished:
            self.abort_request(unfinished)
        self.worker.close()
        self.engine_core.executor = _ClosedRunner()
        self.model_runner = None  # type: ignore[assignment]
        self.model = None

    # ---- numbers for lessons and the server ----
    @property
    def step_records(self) -> deque[StepRecord]:
        return self.engine_core.step_records

    @property
    def last_step_record(self) -> StepRecord | None:
        return self.engine_core.step_records[-1] if self.engine_core.step_records else None

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def kv_cache_usage(self) -> float:
        return self.scheduler.block_manager.usage

    @property
    def spec_decode_stats(self) -> dict[str, int] | None:
        """Speculative decoding's totals since start (None when it is off): decodes that verified
        drafts, drafted tokens, accepted tokens."""
        if self.config.speculative_config is None:
            return None
        return dict(self.scheduler.spec_decode_stats)

    @property
    def prefix_cache_stats(self) -> dict[str, int]:
        bm = self.scheduler.block_manager
        return {"queries": bm.prefix_cache_queries, "hits": bm.prefix_cache_hits}


def _try_load_tokenizer(path: str | Path | None) -> Any:
    """The model folder's tokenizer, or None when it has none (random test models)."""
    if path is None:
        return None
    try:
        return load_tokenizer(path)
    except ModelNotFoundError:
        return None


def _eos_token_ids(model_config: Any, model_path: Path | None, tokenizer: Any) -> list[int]:
    """EOS ids from config.json, generation_config.json and the tokenizer (vLLM stops on all of them)."""
    ids = set(model_config.eos_token_ids)
    gen = Path(model_path) / "generation_config.json" if model_path is not None else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


class _ClosedRunner:
    """What a closed engine's core executes with: a clear error instead of a freed cache."""

    def execute_model(self, scheduler_output: Any) -> Any:
        raise RuntimeError("this engine is closed; build a new one")


def _weak_stop_checker(engine: LLMEngine) -> Any:
    """``engine._check_stop_string`` without a strong reference to the engine (see ``__init__``)."""
    ref = weakref.ref(engine)

    def check(request: Request, finishing: bool) -> str | None:
        alive = ref()
        return None if alive is None else alive._check_stop_string(request, finishing)

    return check
