"""``benchmarks/gpu_check.py --dry-run``: the device check's plumbing on a CPU at tiny sizes.

The real figures need a CUDA GPU; here every part must run (or say why it is skipped), none may fail,
and the JSON must hold what the summary table printed.
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
    assert "--dry-run" in text and "80 %" in text  # the bandwidth goal is stated


def test_dry_run_runs_every_part_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import gpu_check

    out = tmp_path / "check.json"
    report = gpu_check.main(["--dry-run", "--out", str(out)])
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["dry_run"] is True and saved["device"].startswith("CPU")
    assert set(saved["parts"]) == set(gpu_check.PARTS)
    for name, part in report["parts"].items():
        assert part["passed"] is not False, f"{name}: {part['summary']}\n{part.get('traceback', '')}"
        assert part["summary"] in printed
    assert report["parts"]["memory"]["passed"] is None  # mem_get_info needs CUDA: skipped, with a reason
    equiv = report["parts"]["equivalence"]["rows"]
    assert {r["family"] for r in equiv} == {"llama", "qwen3"}
    assert all(r["fast_eq_reference"] == 1.0 and r["fast_eq_hf"] == 1.0 for r in equiv)
    assert all(r["graph_steps"] > 0 for r in equiv)  # the graph bookkeeping really ran
    floor = report["parts"]["decode_floor"]["rows"][0]
    assert floor["floor_ms"] > 0 and floor["step_ms"] > 0


def test_unknown_part_is_an_error() -> None:
    import gpu_check

    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--parts", "nonsense"])
