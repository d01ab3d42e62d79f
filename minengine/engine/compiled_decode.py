"""The CPU fast path: decode steps run as one ``torch.compile``'d graph (gpt-fast's idea), opt-in.

Why: at batch 1 a decode step must stream every weight once, and the weight GEMVs alone run close to
that bandwidth floor. What keeps an eager step above it is everything else: ~450 small PyTorch calls
(norms, RoPE, attention's gathers, residual adds, module calls), each a few microseconds of dispatch,
and slower still right after a GEMV has pushed the interpreter's data out of the CPU caches
(``benchmarks/decode_floor.py --breakdown``). Inductor fuses the element-wise work into a few C++ loops
and, with ``cpp_wrapper``, calls the kernels from generated C++ instead of Python, so what remains is
the GEMVs and little else.

Shapes: B decodes with L keys (the longest context) vary from step to step; both are marked dynamic, so
one graph serves every L and another every B >= 2 (B == 1 has its own: no padding mask). The graphs
are compiled once, when the engine starts (``warmup``), on slots of a block the scheduler has not handed
out yet (every slot is written before it is read, so the scribble is harmless). Steps the graph does
not cover run the reference path unchanged: a prefill or a prompt chunk in the step, a row that samples
nothing, a step whose padded context exceeds ``max_context_tokens``, models with a sliding window, and
steps of more than one row when the Linear layers run on prepacked weights (``max_batch``).

Decode attention in the graph reads each row's K/V from the paged cache where it lies, once: through
the C++ kernel (``models/cpu_kernels.py``) as an opaque call when it is built, else written as products
and sums that inductor fuses (``DecodeTensors.attend``). Only the second pays for padding (every row is
padded to the longest), hence ``MAX_PADDING``. The Linear layers call what ``models/linear_kernels.py``
chose, oneDNN through ``torch.ops.minengine.onednn_linear`` (inductor cannot lower the mkldnn op on a
dense weight).

fp32 only: in bf16 the fused kernels round once where eager PyTorch rounds after every op, and on a
random-weight 100M model greedy tokens left the eager engine's within 1-6 tokens (inductor's
``emulate_precision_casts`` only delayed it), so a 16-bit model is refused with the reason.

The price is start-up time (tens of seconds on a laptop CPU, less once inductor's on-disk cache is warm)
and a C++ compiler; a failed compile warns and leaves the engine on the reference path. Tokens: the
fused kernels round in a different order than eager PyTorch, so logits differ in the last bits; greedy
tokens stay identical to transformers on the test models (``tests/test_compiled_decode.py``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from minengine.core.sched_output import ScheduledRequest, SchedulerOutput
from minengine.models.attention import KVCache
from minengine.models.paged_decode import DecodeTensors
from minengine.utils import cdiv

# Padded context tokens (rows x longest context) one compiled step takes. Attention reads K/V in place, so
# what grows with it is only the fp32 scores, B x L x H_q (34 MB at 32 query heads); bigger steps run eagerly.
MAX_CONTEXT_TOKENS = 1 << 18
# Padding still costs the graph's attention its arithmetic (every row is padded to the longest), where the
# eager path sorts rows into groups of similar length; past this many padded positions per real one, a
# step runs eagerly. Measured at batch 64 (llama-100m, 2 cores): ~0.15 us per padded position and layer
# compiled, ~0.25-0.7 us per real one eager.
MAX_PADDING = 2.0


def _decode_step(model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor,
                 meta: DecodeTensors, kv_caches: list[KVCache]) -> torch.Tensor:
    """What gets compiled: the model's own forward and LM head, on tensor-only metadata."""
    logits = model.compute_logits(model(input_ids, positions, meta, kv_caches))
    return logits if logits.dtype == torch.float32 else logits.float()


class CompiledDecode:
    """Compiled decode steps for ``ModelRunner``: ``can_run`` a step, ``prepare`` its tensors, ``forward``."""

    def __init__(self, model: torch.nn.Module, kv_caches: list[KVCache], block_size: int, *,
                 max_context_tokens: int = MAX_CONTEXT_TOKENS,
                 compile_fn: Callable[..., Any] | None = None, cpp_attention: bool | None = None,
                 max_batch: int | None = None) -> None:
        windows = getattr(getattr(model, "model", None), "sliding_windows", {None})
        if windows != {None}:
            raise ValueError("compile_decode supports full-attention models only "
                             "(this one has a sliding window)")
        dtype = getattr(model, "dtype", torch.float32)
        if dtype != torch.float32:
            raise ValueError(
                f"compile_decode needs float32 weights, not {dtype}: in 16-bit the fused kernels round "
                "differently from the eager ops and greedy tokens drift from the eager engine's within a few "
                "tokens (and a CPU's bf16 GEMVs are kernel-bound, so compiling gains little there)")
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_context_tokens = max_context_tokens
        # Steps of more rows run eagerly (None: no limit). With prepacked weights the engine passes 1: the
        # graph calls oneDNN on the ordinary weight, and at 2-64 rows the eager path's prepacked GEMMs
        # won over the graph's fused small ops (benchmarks/RESULTS.md §2: the mixed workload 6 % faster)
        self.max_batch = max_batch
        compile_fn = compile_fn or (lambda fn: torch.compile(fn, options={"cpp_wrapper": True}))
        self._fn = compile_fn(_decode_step)
        # Attention inside the graph: the C++ kernel when it builds (no padding cost: each row reads its
        # own blocks), else the products-and-sums form below, which pays for every padded position.
        if cpp_attention is None:
            from minengine.models import cpu_kernels as kernel

            cpp_attention = kernel.load()
        self.cpp_attention = cpp_attention
        self.disabled: str | None = None  # why the compiled path was given up, if it was
        self.num_steps = 0  # steps served by the compiled graph
        self.compile_seconds = 0.0

    def can_run(self, output: SchedulerOutput) -> bool:
        """True for a step of single-token rows that all sample, whose padded context fits one call and
        is not mostly padding."""
        scheduled = output.scheduled
        if self.disabled is not None or not scheduled or (
                self.max_batch is not None and len(scheduled) > self.max_batch):
            return False
        longest = total = 0
        for s in scheduled:
            if s.num_tokens != 1 or not s.sample:
                return False
            longest = max(longest, s.start + 1)
            total += s.start + 1
        if self.cpp_attention:
            return True
        padded = len(scheduled) * longest
        return padded <= self.max_context_tokens and padded <= MAX_PADDING * total

    def prepare(self, output: SchedulerOutput) -> tuple[list[ScheduledRequest], tuple[Any, ...]]:
        """The step's rows as tensors: (input_ids, positions, DecodeTensors)."""
        bs = self.block_size
        ids, positions, slots, lens, tables = [], [], [], [], []
        for s in output.scheduled:
            req, pos = s.request, s.start
            ids.append(req.token_ids[pos])
            positions.append(pos)
            slots.append(req.block_table[pos // bs] * bs + pos % bs)
            lens.append(pos + 1)
            tables.append(req.block_table)
        return list(output.scheduled), self._tensors(ids, positions, slots, lens, tables)

    def _tensors(self, ids: list[int], positions: list[int], slots: list[int], lens: list[int],
                 tables: list[list[int]]) -> tuple[Any, ...]:
        bs, length = self.block_size, max(lens)
        num_blocks = cdiv(length, bs)
        padded = [(t + [0] * num_blocks)[:num_blocks] for t in tables]
        cfg = self.model.config
        ids_t, positions_t = torch.tensor(ids, dtype=torch.long), torch.tensor(positions, dtype=torch.long)
        if self.cpp_attention:
            meta = DecodeTensors(torch.tensor(slots, dtype=torch.long), None, None,
                                 block_tables=torch.tensor(padded, dtype=torch.int32),
                                 seq_lens=torch.tensor(lens, dtype=torch.long))
            return ids_t, positions_t, meta
        pos = torch.arange(length)
        context = torch.tensor(padded, dtype=torch.long)[:, pos // bs] * bs + pos % bs  # [B, L]
        mask = None
        if len(lens) > 1:  # rows shorter than L see only their own keys
            mask = pos < torch.tensor(lens).unsqueeze(1)
        queries = torch.empty(len(lens), cfg.num_attention_heads, cfg.head_dim)
        meta = DecodeTensors(torch.tensor(slots, dtype=torch.long), context, mask, queries)
        return ids_t, positions_t, meta

    @torch.inference_mode()
    def forward(self, args: tuple[Any, ...]) -> torch.Tensor:
        """fp32 logits [B, vocab] for the step's rows (all of them sample)."""
        input_ids, positions, meta = args
        _mark_dynamic(input_ids, positions, meta)
        out = self._fn(self.model, input_ids, positions, meta, self.kv_caches)
        self.num_steps += 1
        return out

    def warmup(self, free_block: int) -> None:
        """Compile the graphs now (B = 1 and B = 2, the graph for every B >= 2, unless ``max_batch`` is 1) on
        ``free_block``'s slots, not in the first request's first token. A compile that fails warns and
        disables the compiled path (``disabled``)."""
        start = time.perf_counter()
        bs = self.block_size
        table = [free_block]
        try:
            for batch in (1, 2) if self.max_batch is None or self.max_batch > 1 else (1,):
                lens = [min(2 + i, bs) for i in range(batch)]  # every slot inside free_block
                slots = [free_block * bs + n - 1 for n in lens]
                args = self._tensors([0] * batch, [n - 1 for n in lens], slots, lens, [table] * batch)
                self.forward(args)
        except Exception as e:  # no C++ compiler, an untested torch: run eagerly rather than fail
            self.disabled = f"{type(e).__name__}: {e}"
            warnings.warn(f"compile_decode: torch.compile failed ({self.disabled}); decode steps run "
                          "eagerly (the reference path)", RuntimeWarning, stacklevel=2)
        self.num_steps = 0
        self.compile_seconds = time.perf_counter() - start


def _mark_dynamic(input_ids: torch.Tensor, positions: torch.Tensor, meta: DecodeTensors) -> None:
    """Tell dynamo B (rows) and L (keys) vary, so a new length reuses the graph instead of recompiling."""
    mark = torch._dynamo.maybe_mark_dynamic
    for t in (meta.context_slots, meta.mask, meta.block_tables):
        if t is not None:
            mark(t, 1)
    if input_ids.shape[0] > 1:
        for t in (input_ids, positions, meta.slot_mapping, meta.context_slots, meta.mask, meta.query_buffer,
                  meta.block_tables, meta.seq_lens):
            if t is not None:
                mark(t, 0)
