"""The engine's executor: SchedulerOutput -> packed inputs -> one forward pass -> sampled tokens.

``ModelRunner.execute_model`` is the ``Executor`` that ``EngineCore`` calls (the simulator's
``RooflineExecutor`` is the other one). It times its own phases, because only it knows when the
device has finished: on CUDA the clock is read after ``torch.cuda.synchronize()``, or the forward's
time would be billed to whichever later phase first waits for the GPU.

Packing (no padding): the new tokens of every scheduled request are concatenated, prefill chunks and
decodes alike, so one forward pass serves the whole batch (Orca's iteration-level batching). Each
token carries its own position, and ``AttentionMetadata`` says where each request's tokens start, how
long its context is, and which cache slot each new K/V goes to. Logits are computed only for the last
token of requests that reach the end of their tokens in this step: a partial prefill chunk samples
nothing, and skipping its rows saves a [tokens, vocab] matmul.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import ScheduledRequest, SchedulerOutput
from minengine.engine.kv_cache import PagedKVCache
from minengine.engine.sampler import Sampler
from minengine.models.attention import AttentionMetadata


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [N] int64, all new tokens of the batch
    positions: torch.Tensor  # [N] int64, each token's position in its own sequence
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [M] rows of the hidden states to turn into logits
    sampled: list[ScheduledRequest]  # the M requests that get a new token, in logits order

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class ModelRunner:
    """Runs the model on a ``SchedulerOutput`` against the paged KV cache, then samples."""

    def __init__(
        self, model: torch.nn.Module, kv_cache: PagedKVCache, device: torch.device, sampler: Sampler
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.sampler = sampler

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step: prepare, forward, sample; phase times go into the step's record."""
        for request_id in scheduler_output.finished_req_ids:
            self.sampler.free(request_id)
        t0 = self._clock()
        inputs = self.prepare_inputs(scheduler_output)
        t1 = self._clock()
        logits = self.forward(inputs)
        t2 = self._clock()
        tokens = self.sampler(logits, [s.request for s in inputs.sampled])
        t3 = self._clock()
        sampled = {s.request_id: tok for s, tok in zip(inputs.sampled, tokens, strict=True)}
        return ModelRunnerOutput(sampled, timings={"t_prepare": t1 - t0, "t_forward": t2 - t1, "t_sample": t3 - t2})

    def _clock(self) -> float:
        """perf_counter after the device has finished the work queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def prepare_inputs(self, output: SchedulerOutput) -> ModelInput:
        """Build the packed tensors on the CPU (plain Python lists), then copy them to the device once."""
        ids: list[int] = []
        positions: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        logits_rows: list[int] = []
        sampled: list[ScheduledRequest] = []
        for s in output.scheduled:
            req, end = s.request, s.start + s.num_tokens
            ids += req.token_ids[s.start : end]
            positions += range(s.start, end)
            query_lens.append(s.num_tokens)
            seq_lens.append(end)
            tables.append(req.block_table)
            if s.sample:
                logits_rows.append(len(ids) - 1)
                sampled.append(s)
        meta = AttentionMetadata.build(
            query_lens, seq_lens, tables, self.kv_cache.block_size, device=self.device
        )
        return ModelInput(
            input_ids=_to_device(ids, self.device),
            positions=_to_device(positions, self.device),
            attn_metadata=meta,
            logits_indices=_to_device(logits_rows, self.device),
            sampled=sampled,
        )

    @torch.inference_mode()
    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """One forward over the packed batch; returns fp32 logits [M, vocab] for the sampled requests."""
        hidden = self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_cache.kv_caches)
        if not inputs.sampled:
            return hidden.new_empty((0, 0), dtype=torch.float32)
        return self.model.compute_logits(hidden[inputs.logits_indices]).float()


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.long)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t
