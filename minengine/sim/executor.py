"""The simulator's executor: a ``SchedulerOutput`` goes in, a predicted step time comes out.

In the real engine the model runner turns the scheduler's batch into tensors and runs the model; here
the same batch is turned into (new tokens, cached tokens) per request and priced by the roofline cost
model (``minengine.perf.roofline``). No tokens are computed: every sampled token is ``DUMMY_TOKEN``
and requests stop at their target length (``ignore_eos`` + ``max_tokens``, or an EOS at ``eos_at``).

The hot loop of the simulator runs here once per step, so the common case (no sliding windows) is
written out in plain arithmetic instead of building chunk lists: the same per-op sum as
``CostModel.step_cost`` (each op's max(compute, memory), summed), which ``test_sim`` checks it agrees with.
"""

from __future__ import annotations

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import SchedulerOutput
from minengine.perf.roofline import LOGIT_BYTES, CostModel, StepCost

DUMMY_TOKEN = 1  # every "sampled" token; prompts carry a unique id, so no spurious prefix-cache hits
EOS_TOKEN = 0  # sampled when a request reaches its hidden true length (``eos_at``)


class RooflineExecutor:
    """The ``Executor`` of the simulator: prices each step with a ``CostModel`` (datasheet or calibrated)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        # request id -> its true output length, for requests that must not reveal it
        # (``RequestSpec.max_tokens``): the token that reaches it is an EOS. Kept here, not on the request,
        # so a policy never sees it.
        self.eos_at: dict[str, int] = {}
        cm, m = cost_model, cost_model.model
        self._full_attention = all(w is None for w in m.layer_windows)
        # Constants of the fast path (the per-op sum of CostModel.step_cost, written out), in seconds per
        # token / per sampled row / per pair / per KV token, already divided by each op's rate.
        r, bpp = cm.rates(), m.weight_bytes_per_param
        gemm, weights, kv, attn = (r["gemm_compute"], r["weight_stream"], r["kv_stream"],
                                   r["attention_compute"])
        proj, mlp = m.proj_flop_params, m.body_flop_params - m.proj_flop_params
        self._proj = (2.0 * proj / gemm, m.proj_params * bpp / weights)  # (per token, per step)
        self._mlp = (2.0 * mlp / gemm, (m.streamed_body_params - m.proj_params) * bpp / weights)
        self._lm = (2.0 * m.lm_head_params / gemm, m.lm_head_params * bpp / weights)
        self._t_pair = m.num_layers * m.attention_flops_per_pair / attn
        self._t_kv = m.kv_bytes_per_token / kv  # read or write of one token's K/V, all layers
        self._t_elem = m.elementwise_bytes_per_token / kv
        self._t_logits = 2 * LOGIT_BYTES * m.vocab_size / kv
        self._overhead, self._per_seq = cm.overhead_s, cm.overhead_per_seq_s

    def step_cost(self, output: SchedulerOutput) -> StepCost:
        """The full breakdown (slower; for inspection and tests)."""
        chunks = [(e[1], e[2]) for e in output.entries]
        return self.cost_model.step_cost(chunks, sum(e[4] for e in output.entries))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A dummy token for every request that samples; the step takes ``step_time`` seconds."""
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

    def step_time(self, output: SchedulerOutput, num_sampled: int | None = None) -> float:
        """Predicted seconds for this step (``num_sampled``: the LM-head rows, if the caller counted them).

        Decodes come from ``decode_context_lens`` in bulk (a decode computes one token, so its chunk is
        ``(1, length - 1)``); only the prefill chunks are looked at one by one, and a one-token chunk is
        priced as a decode, as ``CostModel.step_cost`` does.
        """
        if not self._full_attention:
            return self.step_cost(output).time
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
        t = max(tokens * proj[0], proj[1]) + max(tokens * mlp[0], mlp[1])
        if sampled:
            t += max(sampled * lm[0], lm[1]) + sampled * self._t_logits
        if p_pairs:
            t += max(p_pairs * t_pair, p_kv * t_kv)
        if decodes:
            t += max(d_kv * t_pair, (d_kv + decodes) * t_kv)
        return t + tokens * self._t_elem + self._overhead + self._per_seq * len(output.entries)
