"""Pipeline parallelism in the cost model and the simulator (issue 41, deliverable 2, PP part).

The claims the course makes with it: a pipeline splits the layers (and their weights and KV) over its
stages; one batch crosses them in turn, so alone it is no faster than one GPU (plus the sends), and the
stages it is not in sit idle (the bubble); p batches in flight fill the pipeline.
"""

from __future__ import annotations

import pytest

from minengine.perf.roofline import CostModel, pipeline_stage_layers
from minengine.sim.pipeline import Pipeline
from minengine.sim.simulator import Simulator
from minengine.sim.workload import Fixed, Uniform, synthetic_workload


def test_layers_are_split_as_vllm_splits_them() -> None:
    """vLLM's get_pp_indices: an even split, the remainder to the stages before the last."""
    assert pipeline_stage_layers(80, 1) == [80]
    assert pipeline_stage_layers(80, 4) == [20, 20, 20, 20]
    assert pipeline_stage_layers(80, 3) == [27, 27, 26]
    assert pipeline_stage_layers(32, 5) == [6, 6, 7, 7, 6]  # 2 left over: the two stages before the last
    for bad in (0, 81):
        with pytest.raises(ValueError, match="between 1 and the model's 80 layers"):
            pipeline_stage_layers(80, bad)
    with pytest.raises(ValueError, match="between 1 and"):
        CostModel.create("llama-2-70b", "h100", pipeline_parallel_size=81)


def test_stages_share_a_steps_cost_by_layers_and_add_the_sends() -> None:
    one = CostModel.create("llama-2-70b", "h100", dtype="bf16", tensor_parallel_size=2)
    chunks = [(1, 1023)] * 32 + [(256, 0)]
    whole = one.step_cost(chunks)
    assert one.stage_times(chunks) == [whole.time]
    four = one.with_(pipeline_parallel_size=4)
    times = four.stage_times(chunks)
    tokens = 32 + 256
    send = four.pipeline_send_time(tokens)
    assert send == pytest.approx(10e-6 + 2 * tokens * 8192 * 2 / 450e9)  # hidden + residual, bf16, NVLink 4
    # one batch's trip: the one-GPU step plus three hand-overs
    assert sum(times) == pytest.approx(whole.time + 3 * send)
    head = whole.op("lm_head").time + whole.op("sampling").time
    body = whole.time - head - whole.overhead
    assert times[1] == pytest.approx(body / 4 + send)  # a middle stage: 20 of 80 layers, then its send
    assert times[0] == pytest.approx(body / 4 + send + whole.overhead)  # the step's scheduling first
    assert times[3] == pytest.approx(body / 4 + head)  # the last samples, sends nothing
    assert max(times) < whole.time / 3  # each stage is busy ~1/4 of the step


def test_the_simulator_prices_every_pipelined_step_as_the_cost_model_does() -> None:
    cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", tensor_parallel_size=2,
                          pipeline_parallel_size=2)
    sim = Simulator(cost_model=cm, max_num_batched_tokens=512)
    assert "on 4 x H100 SXM 80GB (TP 2 x PP 2)" in sim.describe()
    step_time, checked = sim.executor.step_time, []

    def spy(out, num_sampled=None):
        elapsed = step_time(out, num_sampled)
        stages = sim.executor.last_stage_times
        assert stages == pytest.approx(cm.stage_times_of(sim.executor.step_cost(out)), rel=1e-9)
        checked.append(len(stages))
        return elapsed

    sim.executor.step_time = spy  # type: ignore[method-assign]
    result = sim.run(synthetic_workload(40, 20, Uniform(20, 800), Uniform(1, 30), seed=0))
    assert len(result.requests) == 40 and checked and set(checked) == {2}


def test_the_fullest_stage_sizes_the_kv_cache() -> None:
    """Each stage holds its layers' weights and its layers' K/V of every token: at PP 2 a GPU holds
    half of both, so the same GPUs hold far more tokens than at TP 1 with a whole copy each."""
    from minengine.kvcalc.calculator import kv_cache_budget

    cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", pipeline_parallel_size=2)
    sim = Simulator(cost_model=cm)
    m = cm.model
    table, body = m.lm_head_params, m.num_params - 2 * m.lm_head_params  # untied embedding and LM head
    stage_weights = 2.0 * (body / 2 + table)  # 40 layers and one of the two tables, bf16
    budget = kv_cache_budget(cm.accelerator.memory_bytes, 0.9, stage_weights)
    assert sim.num_blocks == int(budget // (16 * m.kv_bytes_per_token / 2))


def test_one_request_leaves_a_bubble_and_many_fill_the_pipeline() -> None:
    """One stream: every stage is busy ~1/p of the run and each token takes the one-GPU time (no speed-up:
    the stages run one after another). 64 streams: the p virtual engines keep p batches in flight and
    the stages are busy nearly all the time, but the throughput stays about that of the one-stage replica
    at the same 64 streams: each of the p micro-batches of 64/p reads the stage's weights again, and a
    decode step costs about the same at 16 rows as at 64. A pipeline buys memory (room for more streams),
    not fewer weight reads."""
    def run(pp: int, n: int, out: int) -> tuple[float, float, list[float]]:
        cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", tensor_parallel_size=2,
                              pipeline_parallel_size=pp)
        result = Simulator(cost_model=cm, num_blocks=4096).run(
            synthetic_workload(n, float("inf"), Fixed(256), Fixed(out), seed=0))
        s = result.summary()
        busy = result.stage_utilization[0] if result.stage_utilization else [1.0]
        return s.tpot.mean, s.output_throughput, busy

    tpot1, _, _ = run(1, 1, 64)
    tpot4, _, busy4 = run(4, 1, 64)
    assert tpot1 < tpot4 < 1.05 * tpot1  # the same token time, plus three hand-overs
    assert all(0.2 < b < 0.3 for b in busy4)  # each of 4 stages works a quarter of the time
    _, tput1, _ = run(1, 64, 256)
    _, tput4, busy4 = run(4, 64, 256)
    assert min(busy4) > 0.85
    assert 0.95 < tput4 / tput1 < 1.3


def test_a_pipeline_holds_more_streams_than_one_copy_of_the_weights_leaves_room_for() -> None:
    """The same 4 GPUs as PP 2 x TP 2 against TP 2 alone: each GPU holds half the layers, so the KV cache
    grows from what a 35 GB weight share leaves to what a 17.5 GB one leaves, and 256 long requests run
    with no preemption and at a higher throughput."""
    results = {}
    for pp in (1, 2):
        cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", tensor_parallel_size=2,
                              pipeline_parallel_size=pp)
        results[pp] = Simulator(cost_model=cm).run(
            synthetic_workload(256, float("inf"), Fixed(1024), Fixed(256), seed=0))
    assert results[1].num_preemptions > 0 and results[2].num_preemptions == 0
    assert results[2].summary().output_throughput > 1.3 * results[1].summary().output_throughput


def test_a_stage_waits_for_the_batch_ahead_of_it() -> None:
    pipe = Pipeline(2)
    assert pipe.run(0.0, [1.0, 1.0]) == 2.0  # stage 0 in [0, 1], stage 1 in [1, 2]
    assert pipe.run(0.5, [1.0, 1.0]) == 3.0  # stage 0 free at 1: [1, 2]; stage 1 free at 2: [2, 3]
    assert pipe.utilization(3.0) == [pytest.approx(2 / 3), pytest.approx(2 / 3)]


def test_disaggregated_pools_refuse_a_pipeline() -> None:
    from minengine.sim.cluster import DisaggregatedCluster

    cm = CostModel.create("llama-2-70b", "h100", dtype="bf16", pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="does not model pipeline parallelism"):
        DisaggregatedCluster(cost_model=cm)


def test_simulate_takes_pp_and_reports_the_bubble(capsys: pytest.CaptureFixture[str]) -> None:
    from minengine.cli.main import main

    rc = main(["simulate", "--model", "llama-2-70b", "-tp", "2", "-pp", "2", "--num-requests", "8",
               "--input-len", "128", "--output-len", "16"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "(TP 2 x PP 2)" in out.out and "Pipeline stages busy (replica 0):" in out.out
    assert main(["simulate", "--model", "llama-2-70b", "-pp", "100"]) == 2
    assert "between 1 and the model's 80 layers" in capsys.readouterr().err
