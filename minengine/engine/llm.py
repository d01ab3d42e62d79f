"""``LLM``: the offline API (vLLM's ``LLM(...).generate(prompts, sampling_params)``).

All prompts are added at once and the engine steps until every one has finished, so the scheduler
batches them continuously. After a call, ``llm.step_records`` and ``llm.request_records`` hold that
call's records for the lessons' metrics and plots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from minengine.config import EngineConfig
from minengine.core.records import RequestRecord, StepRecord
from minengine.core.sampling_params import RequestOutputKind, SamplingParams
from minengine.engine.gc_heap import gc_heap_frozen
from minengine.engine.llm_engine import LLMEngine, PromptType
from minengine.engine.outputs import RequestOutput
from minengine.engine.worker import RuntimeInfo


class LLM:
    """``LLM(model=None, **engine_options)``: ``model`` is a shipped name, an HF folder, a hub id, or a
    loaded ``LlamaForCausalLM``; the options are ``EngineConfig`` fields (block_size, num_blocks,
    max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, enable_prefix_caching, policy, ...)."""

    def __init__(self, model: Any = None, *, tokenizer: Any = None, **engine_options: Any) -> None:
        if isinstance(tokenizer, str):
            engine_options["tokenizer"], tokenizer = tokenizer, None
        if model is None or isinstance(model, str) or hasattr(model, "__fspath__"):
            config = EngineConfig.from_kwargs(model=None if model is None else str(model), **engine_options)
            self.llm_engine = LLMEngine(config, tokenizer=tokenizer)
        else:  # an already loaded model
            self.llm_engine = LLMEngine(
                EngineConfig.from_kwargs(**engine_options), model=model, tokenizer=tokenizer
            )
        self.step_records: list[StepRecord] = []
        self.request_records: list[RequestRecord] = []

    @property
    def config(self) -> EngineConfig:
        return self.llm_engine.config

    @property
    def runtime(self) -> RuntimeInfo:
        """What this engine runs (attention backend, graphs, dtype, KV layout) and why."""
        return self.llm_engine.runtime

    def close(self) -> None:
        """Free the engine's device memory now (KV cache, graphs, compiled steps); ``del llm`` does too.
        A notebook that builds several engines on a GPU closes each one (or uses ``with LLM(...)``)."""
        self.llm_engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        ``prompts``: a string, a list of strings, a list of token id lists (one flat list of ints is
        one prompt), or dicts {"prompt": ...} / {"prompt_token_ids": [...]}.
        """
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} sampling params for {len(prompt_list)} prompts")
        engine = self.llm_engine
        if engine.closed:
            raise RuntimeError("this LLM is closed; build a new one")
        # Only final outputs: no per-step copy of every request's growing output (vLLM does the same).
        final_only = RequestOutputKind.FINAL_ONLY
        final = {id(sp): dataclasses.replace(sp, output_kind=final_only) for sp in params_list}
        # Validate everything before queueing anything, so a bad prompt leaves the engine untouched.
        requests = [
            engine.process_inputs(None, p, final[id(sp)])
            for p, sp in zip(prompt_list, params_list, strict=True)
        ]
        for request in requests:
            engine.add_processed_request(request)
        index = {r.request_id: i for i, r in enumerate(requests)}
        results: list[RequestOutput | None] = [None] * len(requests)
        steps_before = engine.engine_core.num_steps
        bar = tqdm(total=len(requests), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        num_in = num_out = 0
        try:
            # the caller's heap (a notebook's earlier results) stays out of GC walks while the steps run
            with gc_heap_frozen():
                while engine.has_unfinished_requests():
                    for out in engine.step():
                        if out.finished and out.request_id in index:
                            results[index[out.request_id]] = out
                            num_in += len(out.prompt_token_ids)
                            num_out += len(out.outputs[0].token_ids)
                            bar.update(1)
                            elapsed = bar.format_dict["elapsed"] or 1e-9
                            bar.set_postfix_str(
                                f"input {num_in / elapsed:.0f} tok/s, output {num_out / elapsed:.0f} tok/s"
                            )
        except BaseException:
            engine.abort_request([r.request_id for r in requests])  # e.g. Ctrl-C in a notebook
            raise
        finally:
            bar.close()
        num_steps = engine.engine_core.num_steps - steps_before
        self.step_records = list(engine.step_records)[-num_steps:] if num_steps else []
        self.request_records = [r.record for r in requests]
        return [r for r in results if r is not None]


def _as_prompt_list(prompts: Any) -> list[PromptType]:
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return prompts
