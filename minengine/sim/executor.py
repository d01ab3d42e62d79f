"""The simulator's executor: a ``SchedulerOutput`` goes in, a predicted step time comes out.

In the real engine the model runner turns the scheduler's batch into tensors and runs the model; here
the same batch is turned into (new tokens, cached tokens) per request and priced by the roofline cost
model (``minengine.perf.roofline``). No tokens are computed: every sampled token is ``DUMMY_TOKEN``
and requests stop at their target length (``ignore_eos`` + ``max_tokens``).

The hot loop of the simulator runs here once per step, so the common case (no sliding windows) is
written out in plain arithmetic instead of building chunk lists; ``test_sim`` checks it agrees with
``CostModel.step_cost``.
"""

from __future__ import annotations

from minengine.core.engine_core import ModelRunnerOutput
from minengine.core.sched_output import SchedulerOutput
from minengine.perf.roofline import CostModel, StepCost

DUMMY_TOKEN = 1  # every "sampled" token; prompts carry a unique id, so no spurious prefix-cache hits


class RooflineExecutor:
    """The ``Executor`` of the simulator: prices each step with a ``CostModel`` (datasheet or calibrated)."""

    def __init__(self, cost_model: CostModel) -> None:
        self.cost_model = cost_model
        cm, m = cost_model, cost_model.model
        self._full_attention = all(w is None for w in m.layer_windows)
        # Constants of the fast path, per token / per pair / per KV token, already divided by the rate.
        compute_rate = cm.peak_flops * cm.compute_efficiency
        memory_rate = cm.accelerator.bandwidth_bytes_per_s * cm.memory_efficiency
        self._t_token = 2.0 * m.body_flop_params / compute_rate
        self._t_sample = 2.0 * m.lm_head_params / compute_rate
        self._t_pair = m.num_layers * m.attention_flops_per_pair / compute_rate
        self._t_weights = m.weight_bytes / memory_rate
        self._t_kv = m.kv_bytes_per_token / memory_rate  # read or write of one token's K/V, all layers
        self._overhead, self._per_seq = cm.overhead_s, cm.overhead_per_seq_s

    def step_cost(self, output: SchedulerOutput) -> StepCost:
        """The full breakdown (slower; for inspection and tests)."""
        chunks = [(s.num_tokens, s.start) for s in output.scheduled]
        return self.cost_model.step_cost(chunks, sum(s.sample for s in output.scheduled))

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """A dummy token for every request that samples; the step takes ``step_time`` seconds."""
        sampled = {s.request_id: DUMMY_TOKEN for s in scheduler_output.scheduled if s.sample}
        return ModelRunnerOutput(sampled, elapsed=self.step_time(scheduler_output))

    def step_time(self, output: SchedulerOutput) -> float:
        """Predicted seconds for this step."""
        if not self._full_attention:
            return self.step_cost(output).time
        tokens = sampled = pairs = kv_read = 0
        for s in output.scheduled:
            c, p = s.num_tokens, s.start
            tokens += c
            kv_read += p + c
            pairs += c * p + c * (c + 1) // 2
            sampled += s.sample
        if not tokens:
            return 0.0
        compute = tokens * self._t_token + sampled * self._t_sample + pairs * self._t_pair
        memory = self._t_weights + (kv_read + tokens) * self._t_kv
        return max(compute, memory) + self._overhead + self._per_seq * len(output.scheduled)
