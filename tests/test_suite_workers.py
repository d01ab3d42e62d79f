"""``make test`` runs on several pytest-xdist workers (tests/conftest.py): a test marked ``alone`` must
then run with no other test beside it, while the others still run side by side.

A small suite in a temporary folder, with this repository's conftest, records when each test ran; the
intervals say whether the workers kept to the rule.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

TEST_FILE = '''
import time

import pytest

LOG = {log!r}


def spend(name, seconds):
    start = time.monotonic()
    time.sleep(seconds)
    with open(LOG, "a") as f:
        f.write(f"{{name}} {{start}} {{time.monotonic()}}\\n")
'''


def intervals(log: Path) -> dict[str, tuple[float, float]]:
    out = {}
    for line in log.read_text().splitlines():
        name, start, end = line.split()
        out[name] = (float(start), float(end))
    return out


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.timeout(300)
def test_an_alone_test_has_the_machine_to_itself_and_the_rest_run_side_by_side(tmp_path: Path) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is in the dev extra (make setup)")
    suite, log = tmp_path / "suite", tmp_path / "log"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "pytest.ini").write_text("[pytest]\n")  # this folder is the root, not the repository
    head = TEST_FILE.format(log=str(log))
    # In make test's order, one worker starts file a (the timed test) and the other file b at once;
    # file c follows a. Without the rule the timed test would overlap b's first tests.
    (suite / "test_a_timed.py").write_text(head + '''

@pytest.mark.alone
def test_timed():
    spend("alone", 1.0)
''')
    for letter in "bc":
        (suite / f"test_{letter}_plain.py").write_text(head + "".join(f'''

def test_{i}():
    spend("{letter}{i}", 0.4)
''' for i in range(6)))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadfile", "--no-loadscope-reorder", str(suite)],
                         cwd=suite, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = intervals(log)
    assert len(ran) == 13, sorted(ran)
    beside = [name for name, span in ran.items() if name != "alone" and overlap(span, ran["alone"])]
    assert not beside, f"ran beside the alone test: {beside}"
    # the rule costs only the alone test's own time: the two plain files did run side by side
    assert any(overlap(ran[f"b{i}"], ran[f"c{j}"]) for i in range(6) for j in range(6)), ran
