"""``benchmarks/gpu_check.py --dry-run``: the device check's plumbing on a CPU at tiny sizes.

The real figures need a CUDA GPU. Here every part runs in its own process, as on the GPU, through the
GPU path itself (the Triton kernels under the interpreter, the graph bookkeeping replayed eagerly); none
may fail, and the JSON must hold what the summary table printed. A part whose process dies is reported
and the next part still runs, and a part whose engine did not run the path it claims fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_help_documents_every_part(capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check

    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for part in gpu_check.PARTS:
        assert part in text
    assert "--dry-run" in text and "80 %" in text and "15,000" in text  # the goals are stated


def test_dry_run_runs_every_part_in_its_own_process(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check

    out = tmp_path / "check.json"
    report = gpu_check.main(["--dry-run", "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["dry_run"] is True and saved["versions"]["device"].startswith("CPU")
    assert saved["versions"]["torch"] and saved["versions"]["triton"]
    assert set(saved["parts"]) == set(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert part["passed"] is not False, f"{name}: {part['summary']}\n{part.get('traceback', '')}"
        assert part["summary"] in printed
    assert report["parts"]["memory"]["passed"] is None  # mem_get_info needs CUDA: skipped, with a reason
    equiv = report["parts"]["equivalence"]["rows"]
    assert all(r["fast_eq_reference"] == 1.0 and r["fast_eq_hf"] == 1.0 for r in equiv)
    # the GPU path really ran: triton attention, graph bookkeeping, replays
    assert all(r["attention_backend"] == "triton" and r["graph_steps"] > 0 for r in equiv)
    floor = report["parts"]["decode"]["rows"][0]
    assert floor["floor_ms"] > 0 and floor["step_ms"] > 0 and floor["path_ok"]
    offline = report["parts"]["offline_7b"]
    assert offline["step_records"] and offline["step_kinds"]
    assert report["parts"]["kernel"]["cases"] > 0 and not report["parts"]["kernel"]["failed"]


def test_a_dead_part_is_reported_and_the_next_one_runs(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check

    monkeypatch.setitem(gpu_check.PART_LIMIT_S, "no-such-part", 30)  # its process exits on a bad argument
    results = gpu_check.run_all(["no-such-part", "memory"], dry_run=True, budget_s=120)
    assert results["no-such-part"]["passed"] is False
    dead = results["no-such-part"]
    assert "died" in dead["summary"] and "invalid choice" in dead["stderr"]
    assert results["memory"]["passed"] is None  # ran after it, in its own process
    assert "no-such-part" in capsys.readouterr().out


def test_a_part_fails_when_the_engine_ran_another_path(hf_model_dir) -> None:
    import gpu_check

    from minengine import LLM, SamplingParams

    with LLM(hf_model_dir("llama"), attention_backend="gather") as llm:
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3), use_tqdm=False)
        ok, info = gpu_check._path_check(llm, dry_run=True)
    assert not ok and info["attention_backend"] == "gather" and info["graph_steps"] == 0


def test_unknown_part_is_an_error() -> None:
    import gpu_check

    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--parts", "nonsense"])
