"""``python -m minengine.sim.price_records``: a real run's steps priced by the simulator's cost model, on the
H200 run the repository keeps (benchmarks/data/), and its errors for bad input."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from minengine.perf.roofline import CostModel, step_cost_of_record
from minengine.sim import price_records

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"
H200_RUN = DATA / "h200_llama2-7b_offline_2026-12-04.json"


def test_the_h200_run_is_priced_per_kind_of_step(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    records, meta = price_records.load_records(H200_RUN)
    assert meta["gpu"] == "h200" and meta["versions"]["triton"] == "3.6.0" and len(records) > 100
    cost_model = CostModel.create(meta["model"], gpu="h200", dtype="bfloat16")
    priced = price_records.price(records, cost_model)
    assert set(priced) == {"prefill", "decode", "mixed"}
    decodes = [r for r in records if r.decode_context_lens and not r.prefill_chunks]
    assert priced["decode"]["steps"] == len(decodes)
    want = statistics.median(r.duration for r in decodes) / statistics.median(
        step_cost_of_record(cost_model, r).time for r in decodes)
    assert priced["decode"]["ratio"] == pytest.approx(want)
    assert 0.5 < priced["mixed"]["ratio"] < 2  # the run's own figure: 1.14x (RESULTS.md §9)

    png = tmp_path / "priced.png"
    assert price_records.main([str(H200_RUN), "--fit", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "decode" in out and "held out" in out and png.stat().st_size > 10_000


def test_a_file_without_records_or_a_model_is_a_clear_error(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"step_records": []}))
    assert price_records.main([str(empty)]) == 2
    assert "no step records" in capsys.readouterr().err
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(json.loads(H200_RUN.read_text())["step_records"][:5]))
    assert price_records.main([str(bare)]) == 2
    assert "--gpu and --model" in capsys.readouterr().err
