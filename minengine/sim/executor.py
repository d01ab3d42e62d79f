"""The simulator's executor: a ``SchedulerOutput`` goes in, a predicted step time comes out.

In the real engine the model runner turns the scheduler's batch into tensors and runs the model; here
the same batch is turned into (new tokens, cached tokens) per request and priced by the roofline cost
model (``minengine.perf.roofline``). No tokens are computed: every sampled token is ``DUMMY_TOKEN``
and requests stop at their target length (``ignore_eos`` + ``max_tokens``, or an EOS at ``eos_at``).

Speculative decoding: no model runs, so nothing can be guessed or checked. ``SimDrafter`` drafts
``num_speculative_tokens`` placeholder tokens for every decode, and the executor accepts each draft with
probability ``acceptance_rate``, independently, until the first rejection (the model behind
``perf.speculative``'s closed form); a verify step is priced as what it computes, a chunk of 1 + drafts
tokens over the cached context with an LM-head row per token. The scheduler, its block accounting and
the rollback of rejected drafts are the engine's own.

The hot loop of the simulator runs here once per step, so the common case (no sliding windows) is
written out in plain arithmetic instead of building chunk lists: the same per-op sum as
``CostModel.step_cost`` (each op's max(compute, memory), summed), which ``test_sim`` checks it agrees with.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import SchedulerOutput
from minengine.perf.roofline import LOGIT_BYTES, CostModel, StepCost

DUMMY_TOKEN = 1  # every "sampled" token; prompts carry a unique id, so no spurious prefix-cache hits
EOS_TOKEN = 0  # sampled when a request reaches its hidden true length (``eos_at``)


class SimDrafter:
    """The simulator's drafter: ``k`` placeholder tokens for every decode (none past ``max_model_len``).

    A real drafter sometimes has no guess (n-gram lookup finds no match); here every step drafts the
    full ``k`` and ``acceptance_rate`` carries all of the workload's predictability."""

    def __init__(self, num_speculative_tokens: int, max_model_len: int) -> None:
        self.k, self.max_model_len = num_speculative_tokens, max_model_len

    def propose(self, token_ids: Sequence[int]) -> list[int]:
        return [DUMMY_TOKEN] * max(0, min(self.k, self.max_model_len - len(token_ids)))


class RooflineExecutor:
    """The ``Executor`` of the simulator: prices each step with a ``CostModel`` (datasheet or calibrated).

    ``acceptance_rate`` (speculative decoding only): the chance that each draft is kept, drawn from a
    ``random.Random(seed)`` that ``reset()`` restarts, so one workload gives the same run every time."""

    def __init__(self, cost_model: CostModel, acceptance_rate: float | None = None, seed: int = 0) -> None:
        if acceptance_rate is not None and not 0.0 <= acceptance_rate <= 1.0:
            raise ValueError(f"acceptance_rate must be in [0, 1] (the chance that a draft is kept), "
                             f"got {acceptance_rate!r}")
        self.cost_model = cost_model
        self.acceptance_rate, self.seed = acceptance_rate, seed
        self._rng = random.Random(seed)
        # request id -> its true output length, for requests that must not reveal it
        # (``RequestSpec.max_tokens``): the token that reaches it is an EOS. Kept here, not on the request,
        # so a policy never sees it.
        self.eos_at: dict[str, int] = {}
        cm = cost_model
        m = cm.model.sharded(cm.tensor_parallel_size)  # one GPU's share under tensor parallelism
        self._full_attention = all(w is None for w in m.layer_windows)
        # Constants of the fast path (the per-op sum of CostModel.step_cost, written out), in seconds per
        # token / per sampled row / per pair / per KV token, already divided by each op's rate.
        r, bpp = cm.rates(), m.weight_bytes_per_param
        gemm, weights, kv, attn = (r["gemm_compute"], r["weight_stream"], r["kv_stream"],
                                   r["attention_compute"])
        proj, mlp = m.proj_flop_params, m.body_flop_params - m.proj_flop_params
        self._proj = (2.0 * proj / gemm, m.proj_params * bpp / weights)  # (per token, per step)
        self._mlp = (2.0 * mlp / gemm, m.mlp_weight_bytes(1) / weights)
        self._moe = (m, weights) if m.num_experts else None  # MoE: the bytes read depend on the batch
        self._lm = (2.0 * m.lm_head_params / gemm, m.lm_head_params * bpp / weights)
        self._t_pair = m.num_layers * m.attention_flops_per_pair / attn
        self._t_kv = m.kv_bytes_per_token / kv  # read or write of one token's K/V, all layers
        self._t_elem = m.elementwise_bytes_per_token / kv
        self._t_logits = 2 * LOGIT_BYTES * m.vocab_size / kv
        self._overhead, self._per_seq = cm.overhead_s, cm.overhead_per_seq_s
        # tensor parallelism: the all-reduces' fixed cost per step and their ring bytes per token
        self._all_reduce = (0.0, 0.0)
        if cm.tensor_parallel_size > 1:
            one, two = cm.all_reduce_cost(1), cm.all_reduce_cost(2)
            self._all_reduce = (2 * one.time - two.time, two.time - one.time)  # (per step, per token)
        # pipeline parallelism: step_time is one batch's trip through all stages; each stage's share is
        # kept in last_stage_times for the pipeline that decides when the stages are free
        self._pipeline = cm.pipeline_parallel_size > 1
        self.last_stage_times: list[float] = []

    def reset(self) -> None:
        """Forget the last run's hidden lengths and restart the acceptance draws (a new run)."""
        self.eos_at.clear()
        self._rng = random.Random(self.seed)

    def step_cost(self, output: SchedulerOutput) -> StepCost:
        """The full breakdown (slower; for inspection and tests). A decode that verifies d drafts is a
        chunk of 1 + d tokens and samples 1 + d LM-head rows."""
        chunks = [(e[1], e[2]) for e in output.entries]
        spec = output.scheduled_spec_decode_tokens
        rows = sum(e[1] if e[0].request_id in spec else 1 for e in output.entries if e[4])
        return self.cost_model.step_cost(chunks, rows)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A dummy token for every request that samples; the step takes ``step_time`` seconds."""
        if scheduler_output.scheduled_spec_decode_tokens:
            return self._verify(scheduler_output)
        eos_at, entries = self.eos_at, scheduler_output.entries
        if not eos_at:  # this runs once per request per simulated step: a comprehension, nothing else
            sampled = {e[0].request_id: DUMMY_TOKEN for e in entries if e[4]}
        else:
            sampled = {}
            for req, _, _, _, sample in entries:
                if sample:
                    n = eos_at.get(req.request_id)
                    eos = n is not None and len(req.token_ids) - req.num_prompt_tokens + 1 >= n
                    sampled[req.request_id] = EOS_TOKEN if eos else DUMMY_TOKEN
        return ModelRunnerOutput(sampled, elapsed=self.step_time(scheduler_output, len(sampled)))

    def _verify(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """A step in which decodes verify drafts: each keeps its drafts up to the first rejection, then
        the target's own token (the bonus token when none was rejected); an EOS at a hidden length cuts
        the run where it falls."""
        spec, rate, draw = output.scheduled_spec_decode_tokens, self.acceptance_rate, self._rng.random
        assert rate is not None, "drafts were scheduled but the executor has no acceptance_rate"
        sampled: dict[str, int | list[int]] = {}
        for req, _, _, _, sample in output.entries:
            if not sample:
                continue
            drafts = spec.get(req.request_id, ())
            kept = 0
            while kept < len(drafts) and draw() < rate:
                kept += 1
            tokens = [DUMMY_TOKEN] * (kept + 1)
            n = self.eos_at.get(req.request_id)
            if n is not None:
                room = n - (len(req.token_ids) - req.num_prompt_tokens)  # tokens up to the true length
                if room <= len(tokens):
                    tokens = tokens[:max(room, 1)]
                    tokens[-1] = EOS_TOKEN
            sampled[req.request_id] = tokens if drafts else tokens[0]
        return ModelRunnerOutput(sampled, elapsed=self._priced(self.step_cost(output)))

    def _priced(self, cost: StepCost) -> float:
        return self._stages(self.cost_model.stage_times_of(cost)) if self._pipeline else cost.time

    def step_time(self, output: SchedulerOutput, num_sampled: int | None = None) -> float:
        """Predicted seconds for this step (``num_sampled``: the LM-head rows, if the caller counted them).
        Under pipeline parallelism: the batch's trip through every stage, each stage's share kept in
        ``last_stage_times``.

        Decodes come from ``decode_context_lens`` in bulk (a decode computes one token, so its chunk is
        ``(1, length - 1)``); only the prefill chunks are looked at one by one, and a one-token chunk is
        priced as a decode, as ``CostModel.step_cost`` does.
        """
        if not self._full_attention:
            return self._priced(self.step_cost(output))
        lens = output.decode_context_lens
        decodes = len(lens)
        d_kv = sum(lens)
        tokens = decodes
        sampled = decodes if num_sampled is None else num_sampled
        p_pairs = p_kv = 0
        for c, p in output.prefill_chunks:
            tokens += c
            if c == 1:
                decodes += 1
                d_kv += p + 1
            else:
                p_kv += p + 2 * c  # reads context + chunk, writes the chunk
                p_pairs += c * p + c * (c + 1) // 2
        if num_sampled is None:
            sampled += sum(1 for e in output.entries if e[3] and e[4])
        if not tokens:
            return 0.0
        t_pair, t_kv = self._t_pair, self._t_kv
        proj, mlp, lm = self._proj, self._mlp, self._lm
        mlp_bytes = mlp[1] if self._moe is None else self._moe[0].mlp_weight_bytes(tokens) / self._moe[1]
        body = max(tokens * proj[0], proj[1]) + max(tokens * mlp[0], mlp_bytes)
        head = max(sampled * lm[0], lm[1]) + sampled * self._t_logits if sampled else 0.0
        if p_pairs:
            body += max(p_pairs * t_pair, p_kv * t_kv)
        if decodes:
            body += max(d_kv * t_pair, (d_kv + decodes) * t_kv)
        if self._all_reduce[1]:
            body += self._all_reduce[0] + tokens * self._all_reduce[1]
        body += tokens * self._t_elem
        fixed = self._overhead + self._per_seq * len(output.entries)
        if self._pipeline:
            return self._stages(self.cost_model.split_stages(body, head, fixed, tokens))
        return body + head + fixed

    def _stages(self, times: list[float]) -> float:
        """Keep a pipeline step's per-stage times for ``PipelineExecutor``; the batch's latency alone."""
        self.last_stage_times = times
        return sum(times)
