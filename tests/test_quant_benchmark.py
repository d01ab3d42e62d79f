"""Smoke test of ``benchmarks/quantization.py``: the tiny shipped model, 2 prompts x 8 tokens, no llama.cpp.

Timings are not asserted (a CI machine's are noise); the invariants are: the reference agrees with
itself, bytes per step shrink with the bits, and the floor is bytes over the measured bandwidth.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytest.importorskip("gguf", reason="the gguf package is not installed (make installs it)")


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_quantization_smoke(tmp_path: Path) -> None:
    from benchmarks import quantization

    out = tmp_path / "quant.json"
    r = quantization.main(["--smoke", "--threads", "1", "--json", str(out)])
    rows = r["rows"]
    ref = rows["minengine fp32"]
    assert ref["token_share"] == 1.0 and ref["identical"] == r["prompts"] == 2
    order = ["fp32", "bf16", "Q8_0", "Q4_1 (as shipped)", "Q4_0", "int3", "int2"]
    sizes = [rows[f"minengine {k}"]["bytes"] for k in order]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 6 * sizes[-1]
    for row in rows.values():
        assert row["floor_ms"] == pytest.approx(row["bytes"] / (r["bandwidth_gb_s"] * 1e9) * 1e3)
        assert row["ppl"] > 1 and 0 <= row["token_share"] <= 1
    assert rows["minengine bf16 (engine)"]["bytes"] == rows["minengine bf16"]["bytes"]
    assert ref["decode_ms"] > 0 and "llama.cpp" not in r
    same, _, total, _ = r["unchanged_by_q4_1"].split()
    assert int(same) < int(total)  # the tiny model's fp32 weights are its own, not Q4_1 values
    saved = json.loads(out.read_text())
    assert saved["model"] == "tinystories-4m" and '"machine"' in out.read_text()
