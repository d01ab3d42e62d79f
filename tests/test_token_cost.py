"""GPU-hour prices and the cost of a million tokens (issue 41, deliverable 3)."""

from __future__ import annotations

import pytest

from minengine.perf.hardware import ACCELERATORS
from minengine.perf.prices import GPU_PRICES, cost_per_million_tokens, gpu_price, gpu_prices, token_costs
from minengine.perf.roofline import CostModel
from minengine.sim.simulator import Simulator
from minengine.sim.token_cost import prefill_time_share, serving_cost
from minengine.sim.workload import Fixed, synthetic_workload


def test_every_price_row_names_a_known_gpu_a_source_and_a_date() -> None:
    for row in GPU_PRICES:
        assert row.gpu in ACCELERATORS, row
        assert "https://" in row.source or "instances.vantage.sh" in row.source, row
        assert len(row.date) >= 7 and row.date[:4].isdigit(), row
        assert 0.1 < row.usd_per_gpu_hour < 20, row
    aws = gpu_price("h100")  # an alias; the table's first H100 row
    assert (aws.provider, aws.offer) == ("AWS", "p5.48xlarge")
    assert aws.usd_per_gpu_hour == pytest.approx(55.04 / 8)
    assert gpu_price("H100", provider="lambda").usd_per_gpu_hour == pytest.approx(3.99)
    rows = gpu_prices("h100-sxm")
    assert [r.usd_per_gpu_hour for r in rows] == sorted(r.usd_per_gpu_hour for r in rows) and len(rows) == 3
    with pytest.raises(ValueError, match="no price for mi300x in the table.*h100-sxm \\(AWS\\)"):
        gpu_price("mi300x")
    with pytest.raises(ValueError, match="from Azure"):
        gpu_price("h100", provider="Azure")


def test_a_million_tokens_cost_the_fleets_hour_over_its_tokens() -> None:
    assert cost_per_million_tokens(1, 2.50, 208) == pytest.approx(2.50 / (208 * 3600) * 1e6)
    assert cost_per_million_tokens(4, 3.00, 10_000) == pytest.approx(1 / 3)
    assert cost_per_million_tokens(1, 2.50, 0) == float("inf")
    costs = token_costs(8, 4.0, request_rate=10, mean_input_tokens=1000, mean_output_tokens=200,
                        prefill_share=0.25)
    per_request = 8 * 4.0 / (10 * 3600)
    assert costs.usd_per_request == pytest.approx(per_request)
    # the two prices together bill every request exactly once
    assert (costs.usd_per_million_input * 1000 + costs.usd_per_million_output * 200) / 1e6 == \
        pytest.approx(per_request)
    assert costs.usd_per_million_input == pytest.approx(per_request * 0.25 / 1000 * 1e6)
    for bad in ({"request_rate": 0}, {"prefill_share": 1.5}):
        kwargs = {"request_rate": 1, "mean_input_tokens": 1, "mean_output_tokens": 1,
                  "prefill_share": 0.5} | bad
        with pytest.raises(ValueError):
            token_costs(1, 1.0, **kwargs)


def test_the_gpu_time_split_follows_the_work() -> None:
    """Prompts only (one output token each): nearly all the time is prompt work. Long answers to short
    prompts: nearly none. So input tokens come out far cheaper than output tokens, as price lists have
    them, and the bill still adds up."""
    cm = CostModel.create("llama-3.1-8b", "h100", dtype="bf16")
    sim = Simulator(cost_model=cm)
    prompts = sim.run(synthetic_workload(64, 20, Fixed(2048), Fixed(1), seed=0))
    answers = sim.run(synthetic_workload(64, 20, Fixed(16), Fixed(512), seed=0))
    assert prefill_time_share(prompts.steps, cm) > 0.9
    assert prefill_time_share(answers.steps, cm) < 0.1
    mixed = sim.run(synthetic_workload(200, 10, Fixed(1024), Fixed(256), seed=0))
    costs = serving_cost(mixed, cm, 6.88, request_rate=10)
    assert costs.usd_per_million_input < costs.usd_per_million_output / 5
    assert costs.usd_per_request == pytest.approx(6.88 / 36000)
    both = (costs.usd_per_million_input * 1024 + costs.usd_per_million_output * 256) / 1e6
    assert both == pytest.approx(costs.usd_per_request)


def test_simulate_prints_the_cost_per_token(capsys: pytest.CaptureFixture[str]) -> None:
    from minengine.cli.main import main

    args = ["simulate", "--model", "llama-3.1-8b", "--rate", "10", "--num-requests", "60", "--input-len",
            "512", "--output-len", "128"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Cost at 10 req/s on 1 GPU at $6.88/GPU-h: AWS p5.48xlarge" in out
    listed = float(out.split("per million input tokens, $")[1].split(" per million output")[0])
    assert main([*args, "--price-per-gpu-hour", "3.44"]) == 0  # half the price, half the cost
    out = capsys.readouterr().out
    assert "$3.44/GPU-h (as given)" in out
    halved = float(out.split("per million input tokens, $")[1].split(" per million output")[0])
    assert halved == pytest.approx(listed / 2, abs=0.01)
    assert main(["simulate", "--model", "llama-3.1-8b", "--gpu", "mi300x", "--num-requests", "5"]) == 0
    assert "no list price for AMD Instinct MI300X" in capsys.readouterr().out
