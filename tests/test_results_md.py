"""benchmarks/RESULTS.md stays usable: it opens with one current table, every reference to it resolves.

RESULTS.md holds the newest figure of each goal and one section per benchmark; earlier runs live in
benchmarks/HISTORY.md, which only RESULTS.md may point into (so the history can grow without breaking a
reference). The course, the code and the tests cite RESULTS.md's sections as "§N": each such reference
must name a section that exists, and each in-file link must land on a heading.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
HISTORY = ROOT / "benchmarks" / "HISTORY.md"
COLUMNS = ["goal (issue.item)", "target", "latest figure", "status", "machine", "date", "command", "§"]
# Where RESULTS.md is cited from (the brief of the rewrite: README, lessons, the package, tests, scripts).
CITING = ["README.md", "lessons/*.ipynb", "minengine/**/*.py", "minengine/**/*.cpp", "tests/*.py",
          "benchmarks/*.py", "labs/**/*.md", "deploy/**/*.md", "book/**/*.md"]
REFERENCE = re.compile(r"RESULTS\.md`?\)?,?\s*"
                       r"(§\s*\d+(?:\s*(?:,|and|or)\s*§\s*\d+)*|section\s+\d+|item\s+\d+)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of each heading outside code fences."""
    found, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^(#{1,6}) (.+)$", line)):
            found.append((len(m.group(1)), m.group(2)))
    return found


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, title in headings(text):
        s = slug(title)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def sections(text: str) -> dict[int, str]:
    """RESULTS.md's numbered sections: N -> title, from its "## N. title" headings."""
    return {int(m.group(1)): m.group(2) for level, title in headings(text)
            if level == 2 and (m := re.match(r"^(\d+)\. (.+)$", title))}


def current_table(text: str) -> list[list[str]]:
    """The rows of the first table after "## Current figures", header first."""
    body = text.split("\n## Current figures\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in body.splitlines() if ln.startswith("|")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
            for row in rows if not set(row) <= set("|-")]


def citing_files() -> list[Path]:
    this = Path(__file__).resolve()  # its own examples of stale references are not references
    return sorted({p for pattern in CITING for p in ROOT.glob(pattern) if p.is_file() and p != this})


# ------------------------------------------------------------------------------------------------ tests
def test_results_opens_with_the_current_table():
    text = RESULTS.read_text()
    assert [t for level, t in headings(text) if level == 2][0] == "Current figures"
    header, *rows = current_table(text)
    assert header == COLUMNS
    assert len(rows) >= 20
    previous_command = ""
    for row in rows:
        assert len(row) == len(COLUMNS), row
        goal, target, figure, status, machine, date, command, section = row
        assert goal and target and figure and status and machine, row
        undated = date == "-" and ("OPEN" in status or "tested" in status)  # no run to date
        assert re.search(r"\d{4}-\d{2}-\d{2}", date) or undated, row
        assert command.startswith("`") or (command.startswith("as the row above") and previous_command), row
        previous_command = command
        if section != "-":
            assert re.fullmatch(r"\[§\d+\]\(#[\w-]+\)", section), section


def test_every_section_the_table_names_exists_and_holds_the_figure_s_command():
    text = RESULTS.read_text()
    numbered, here = sections(text), anchors(text)
    for row in current_table(text)[1:]:
        section = row[7]
        if section == "-":
            continue
        number, anchor = re.fullmatch(r"\[§(\d+)\]\(#([\w-]+)\)", section).groups()
        assert anchor in here and anchor == slug(f"{number}. {numbered[int(number)]}"), section
        script = re.search(r"benchmarks/(\w+\.py)", row[6])
        if script:  # the section says which script it reports on
            body = text.split(f"\n## {number}. ", 1)[1].split("\n## ", 1)[0]
            assert script.group(1) in body, f"§{number} never names {script.group(1)}"


def test_every_reference_to_a_results_section_resolves():
    numbered = sections(RESULTS.read_text())
    found = 0
    for path in citing_files():
        for match in REFERENCE.finditer(path.read_text(errors="replace")):
            cited = match.group(1)
            where = f"{path.relative_to(ROOT)}: {match.group(0)!r}"
            assert "§" in cited, f"{where}: cite RESULTS.md's sections as §N (their numbers are kept)"
            for number in re.findall(r"\d+", cited):
                assert int(number) in numbered, f"{where}: RESULTS.md has no §{number}"
                found += 1
    assert found >= 5  # the README, lessons 01, 02 and 04 and the package cite sections today


def test_the_reference_pattern_catches_stale_forms():
    text = ("see benchmarks/RESULTS.md section 10 and `benchmarks/RESULTS.md` §5 and §6, "
            "(RESULTS.md, item 2)")
    assert [m.group(1) for m in REFERENCE.finditer(text)] == ["section 10", "§5 and §6", "item 2"]


def tracked_text_files() -> list[Path]:
    done = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True)
    if done.returncode != 0:  # not a git checkout: the places RESULTS.md is cited from
        return citing_files()
    return [ROOT / name for name in done.stdout.splitlines()
            if Path(name).suffix in {".md", ".py", ".ipynb", ".cpp", ".toml", ".yml", ".txt", ".sh", ""}]


def test_nothing_but_results_points_into_the_history():
    assert "HISTORY.md" in RESULTS.read_text()
    allowed = {RESULTS, HISTORY, Path(__file__).resolve()}
    pointing = [str(p.relative_to(ROOT)) for p in tracked_text_files()
                if p not in allowed and p.is_file() and "HISTORY.md" in p.read_text(errors="replace")]
    assert pointing == []


@pytest.mark.parametrize("name", ["RESULTS.md", "HISTORY.md"])
def test_links_between_results_and_history_land_on_headings(name: str):
    files = {p.name: p.read_text() for p in (RESULTS, HISTORY)}
    targets = {n: anchors(t) for n, t in files.items()}
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", files[name]):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        file = file or name
        if file not in targets or (anchor and anchor not in targets[file]):
            broken.append(target)
    assert broken == []


def test_every_benchmark_script_is_listed():
    text = RESULTS.read_text()
    scripts_section = text.split("\n## Scripts\n", 1)[1]
    listed = set(re.findall(r"`(\w+\.py)`", scripts_section))
    on_disk = {p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"}
    assert on_disk - listed == set(), "scripts RESULTS.md does not list"
    assert listed - on_disk == set(), "RESULTS.md lists scripts that are gone"
