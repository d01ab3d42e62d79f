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
nothing, and skipping its rows saves a [tokens, vocab] matmul. A decode that verifies k drafts
(speculative decoding) is a chunk of k + 1 tokens with logits at each; the sampler keeps what the
target model agrees with (``engine/rejection_sampler.py``).

Attention goes through the backend the worker chose (``models/attention/backends.py``): it builds the
step's metadata here, once, and every layer's attention reads it. On a GPU (or on a CPU under the Triton
interpreter) an all-decode step that fits a captured size replays a CUDA graph instead
(``engine/fast_path.py``); on a CPU, ``compile_decode=True`` runs all-decode steps as one compiled graph
(``engine/compiled_decode.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import ScheduledRequest, SchedulerOutput
from minengine.engine.kv_cache import PagedKVCache
from minengine.engine.sampler import Sampler
from minengine.engine.tensor_parallel import StepInputs, TensorParallelRanks
from minengine.models.attention.backends import AttentionBackend, ReferenceBackend

if TYPE_CHECKING:
    from minengine.engine.compiled_decode import CompiledDecode
    from minengine.engine.fast_path import DecodeGraphRunner, DecodeInputs


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [N] int64, all new tokens of the batch
    positions: torch.Tensor  # [N] int64, each token's position in its own sequence
    attn_metadata: Any  # what the attention backend built for this step
    logits_indices: torch.Tensor  # [M] rows of the hidden states to turn into logits
    sampled: list[ScheduledRequest]  # the M requests that get a new token, in logits order
    step: StepInputs  # the same batch as lists: what the other tensor-parallel ranks are sent

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


class ModelRunner:
    """Runs the model on a ``SchedulerOutput`` against the paged KV cache, then samples."""

    def __init__(
        self, model: torch.nn.Module, kv_cache: PagedKVCache, device: torch.device, sampler: Sampler,
        *, attn_backend: AttentionBackend | None = None, graph_runner: DecodeGraphRunner | None = None,
        compiled_decode: CompiledDecode | None = None, tp_ranks: TensorParallelRanks | None = None,
    ) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.sampler = sampler
        self.attn_backend = attn_backend if attn_backend is not None else ReferenceBackend()
        self.graph_runner = graph_runner  # None: no CUDA graphs (enforce_eager)
        self.num_graph_steps = 0  # steps served by a graph replay
        self.compiled_decode = compiled_decode  # None: no compiled CPU decode steps (the default)
        self.tp_ranks = tp_ranks  # tensor parallelism, on rank 0: the other ranks (engine/tensor_parallel.py)
        # How the phase times in each StepRecord were taken (the record has no field for it).
        self.timing_method = ("torch.cuda.synchronize() before each perf_counter() read"
                              if device.type == "cuda" else "perf_counter() (CPU work is synchronous)")

    @property
    def attention_backend(self) -> str:
        """The attention backend's name: "gather" (the reference), "cpp" or "triton"."""
        return self.attn_backend.name

    def close(self) -> None:
        """Drop what this runner holds on the device (the worker's ``close``)."""
        self.graph_runner = None
        self.compiled_decode = None
        self.tp_ranks = None
        self.model = None  # type: ignore[assignment]

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step: prepare, forward, sample; phase times go into the step's record."""
        for request_id in scheduler_output.finished_req_ids:
            self.sampler.free(request_id)
        t0 = self._clock()
        graph_step = self._graph_step(scheduler_output)
        if graph_step is not None:
            sampled_reqs, decode_inputs, rows = graph_step
            assert self.graph_runner is not None
            bucket = self.graph_runner.load(decode_inputs)
            t1 = self._clock()
            logits = self._graph_forward(bucket, len(decode_inputs.input_ids), rows)
            self.num_graph_steps += 1
        elif self.compiled_decode is not None and self.compiled_decode.can_run(scheduler_output):
            sampled_reqs, args = self.compiled_decode.prepare(scheduler_output)
            t1 = self._clock()
            logits = self.compiled_decode.forward(args)
        else:
            inputs = self.prepare_inputs(scheduler_output)
            sampled_reqs = inputs.sampled
            t1 = self._clock()
            logits = self.forward(inputs)
        t2 = self._clock()
        spec = scheduler_output.scheduled_spec_decode_tokens
        requests = [s.request for s in sampled_reqs]
        tokens = self.sampler.verify(logits, requests, spec) if spec else self.sampler(logits, requests)
        t3 = self._clock()
        sampled = {s.request_id: tok for s, tok in zip(sampled_reqs, tokens, strict=True)}
        timings = {"t_prepare": t1 - t0, "t_forward": t2 - t1, "t_sample": t3 - t2}
        if self.tp_ranks is not None:  # the part of t_forward spent joining the ranks' partial sums
            timings["t_all_reduce"] = self.tp_ranks.group.take_timings()[0]
        return ModelRunnerOutput(sampled, timings=timings,
                                 timing=self.timing_method)

    def _clock(self) -> float:
        """perf_counter after the device has finished the work queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def prepare_inputs(self, output: SchedulerOutput) -> ModelInput:
        """Pack the step on the CPU (plain Python lists), then copy it to the device once."""
        step = StepInputs([], [], [], [], [])
        logits_rows: list[int] = []
        sampled: list[ScheduledRequest] = []
        spec = output.scheduled_spec_decode_tokens
        ids = step.input_ids
        for s in output.scheduled:
            req, end = s.request, s.start + s.num_tokens
            drafts = spec.get(req.request_id) if spec else None
            if drafts:  # speculative decoding: its last token, then the drafts; logits at every one
                ids.append(req.token_ids[s.start])
                ids += drafts
                logits_rows += range(len(ids) - 1 - len(drafts), len(ids))
            else:
                ids += req.token_ids[s.start : end]
                if s.sample:
                    logits_rows.append(len(ids) - 1)
            step.positions.extend(range(s.start, end))
            step.query_lens.append(s.num_tokens)
            step.seq_lens.append(end)
            step.block_tables.append(req.block_table)
            if s.sample:
                sampled.append(s)
        if self.tp_ranks is not None:  # the other ranks build their tensors while this one does
            self.tp_ranks.send(step)
        return self.model_input(step, logits_rows, sampled)

    def model_input(self, step: StepInputs, logits_rows: list[int] | None = None,
                    sampled: list[ScheduledRequest] | None = None) -> ModelInput:
        """The step's tensors and attention metadata (every tensor-parallel rank builds its own)."""
        meta = self.attn_backend.build_metadata(step.query_lens, step.seq_lens, step.block_tables,
                                                self.kv_cache.block_size, self.device)
        return ModelInput(
            input_ids=_to_device(step.input_ids, self.device),
            positions=_to_device(step.positions, self.device),
            attn_metadata=meta,
            logits_indices=_to_device(logits_rows or [], self.device),
            sampled=sampled or [],
            step=step,
        )

    @torch.inference_mode()
    def forward(self, inputs: ModelInput) -> torch.Tensor:
        """One forward over the packed batch; returns fp32 logits [M, vocab] for the sampled requests.
        Under tensor parallelism the other ranks run the same step alongside (``prepare_inputs`` sent it)."""
        hidden = self.forward_hidden(inputs)
        if not inputs.sampled:
            return hidden.new_empty((0, 0), dtype=torch.float32)
        if inputs.logits_indices.shape[0] < hidden.shape[0]:  # else every row, in order (all decodes)
            hidden = hidden[inputs.logits_indices]
        logits = self.model.compute_logits(hidden)
        return logits if logits.dtype == torch.float32 else logits.float()

    @torch.inference_mode()
    def forward_hidden(self, inputs: ModelInput) -> torch.Tensor:
        """The decoder's hidden states [N, hidden] for the packed batch (its K/V written to the cache)."""
        return self.model(inputs.input_ids, inputs.positions, inputs.attn_metadata, self.kv_cache.kv_caches)

    # ---- the fast path ----
    def _graph_step(
        self, output: SchedulerOutput
    ) -> tuple[list[ScheduledRequest], DecodeInputs, list[int]] | None:
        """An all-decode step that fits a captured graph, as (sampled, its inputs, logits rows); else None."""
        runner = self.graph_runner
        if runner is None or not output.scheduled or not runner.can_run(len(output.scheduled)):
            return None
        if any(s.num_tokens != 1 for s in output.scheduled):
            return None
        from minengine.engine.fast_path import DecodeInputs

        bs = self.kv_cache.block_size
        inputs = DecodeInputs([], [], [], [], [])
        rows, sampled = [], []
        for i, s in enumerate(output.scheduled):
            req, pos = s.request, s.start
            inputs.input_ids.append(req.token_ids[pos])
            inputs.positions.append(pos)
            inputs.slots.append(req.block_table[pos // bs] * bs + pos % bs)
            inputs.block_tables.append(req.block_table)
            inputs.seq_lens.append(pos + 1)
            if s.sample:
                rows.append(i)
                sampled.append(s)
        return sampled, inputs, rows

    @torch.inference_mode()
    def _graph_forward(self, bucket: int, n: int, rows: list[int]) -> torch.Tensor:
        assert self.graph_runner is not None
        hidden = self.graph_runner.replay(bucket, n)
        if not rows:
            return hidden.new_empty((0, 0), dtype=torch.float32)
        index = _to_device(rows, self.device)
        return self.model.compute_logits(hidden[index]).float()


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.long)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t
