"""``make book``: the site builds from whatever executed lessons exist (clean ones otherwise), every
internal link resolves, links are relative (the site works opened from disk), and lab pages hold the
student version only: no solution, no hidden test, no answer key."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("jupyter_book", reason="the book extra is not installed (pip install -e '.[book]')")

from minengine.course import book  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.links.append(value)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The book built once for this module, from the executed lessons the lesson tests left (if any)."""
    base = tmp_path_factory.mktemp("book")
    index = book.build(base / "out", stage_dir=base / "src", execute=False)
    return index.parent


def _pages(site: Path) -> list[Path]:
    return [p for p in site.rglob("*.html") if "_static" not in p.parts and "_sources" not in p.parts]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_lesson_and_lab_has_a_page(site: Path) -> None:
    lessons = sorted((ROOT / "lessons").glob("*.ipynb"))
    labs = [p.name for p in sorted((ROOT / "labs").glob("*")) if (p / f"{p.name}.ipynb").exists()]
    assert lessons and labs
    for path in lessons:
        assert (site / "lessons" / f"{path.stem}.html").exists(), path.name
    for lab in labs:
        assert (site / "labs" / f"{lab}.html").exists(), lab
    landing = (site / "intro.html").read_text()
    text = re.sub(r"<[^>]+>", "", landing)  # highlighted code splits "make course" into spans
    assert "make course" in text and "make test" in text and "Module map" in text
    for path in lessons:
        title = book.title_of(path)
        assert f'href="lessons/{path.stem}.html"' in landing, f"{title} missing from the module map"
    assert "were produced on" in text or "not executed" in text  # it says where outputs come from


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_internal_links_resolve_and_are_relative(site: Path) -> None:
    broken, absolute = [], []
    for page in _pages(site):
        parser = _Links()
        parser.feed(page.read_text())
        for link in parser.links:
            parts = urlsplit(link)
            if parts.scheme in ("http", "https", "mailto", "data", "javascript") or link.startswith("#"):
                continue
            if parts.scheme or link.startswith("/"):
                absolute.append(f"{page.relative_to(site)}: {link}")
                continue
            target = (page.parent / unquote(parts.path)).resolve()
            if parts.path and not target.exists():
                broken.append(f"{page.relative_to(site)}: {link}")
    assert not absolute, "links that break when the site is opened from disk:\n" + "\n".join(absolute[:20])
    assert not broken, "broken internal links:\n" + "\n".join(broken[:20])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lab_pages_hold_no_solutions(site: Path) -> None:
    for folder in sorted(p for p in (ROOT / "labs").glob("*") if (p / f"{p.name}.ipynb").exists()):
        source = json.loads((folder / f"{folder.name}.ipynb").read_text())
        page = (site / "labs" / f"{folder.name}.html").read_text()
        staged = [p.read_text() for p in site.rglob(f"{folder.name}.ipynb")]  # _sources copies
        for text in [page, *staged]:
            for marker in ("BEGIN SOLUTION", "HIDDEN TESTS", "MARK SCHEME", "* [x]"):
                assert marker not in text, f"{folder.name}: {marker!r} on its book page"
        # Lines the solution and hidden-test blocks hold must not appear (the markers alone prove little).
        secret, public = [], []
        block_re = r"### BEGIN (?:SOLUTION|HIDDEN TESTS)\n(.*?)### END[^\n]*"
        for cell in source["cells"]:
            text = "".join(cell["source"])
            for block in re.findall(block_re, text, re.S):
                secret += [ln.strip() for ln in block.splitlines() if len(ln.strip()) > 25 and "@@" not in ln]
            public.append(re.sub(block_re, "", text, flags=re.S))
        shown = "\n".join(public)  # a line the student version shows anyway (a given helper) is no leak
        secret = [ln for ln in secret if ln not in shown]
        assert secret, f"{folder.name}: no solution lines found to check"
        leaked = [ln for ln in secret if ln in page or any(ln in s for s in staged)]
        assert not leaked, f"{folder.name}: solution lines on its book page: {leaked[:3]}"


def test_student_version_and_module_map_without_building(tmp_path: Path) -> None:
    """The staging step alone (fast): every lab's student version is clean, the map lists graded work."""
    info = book.stage(tmp_path / "src", executed_dir=tmp_path / "none")
    assert info["lessons"] and info["executed"] == [] and info["machine"] is None
    intro = (tmp_path / "src" / "intro.md").read_text()
    assert "not executed" in intro and "| Lesson |" in intro and "{module_map}" not in intro
    toc = (tmp_path / "src" / "_toc.yml").read_text()
    assert all(f"lessons/{name}" in toc for name in info["lessons"])
    assert all(f"labs/{lab}" in toc for lab in info["labs"])
    lesson = json.loads((tmp_path / "src" / "lessons" / f"{info['lessons'][0]}.ipynb").read_text())
    assert "without running" in "".join(lesson["cells"][1]["source"])


def test_machine_note_names_cpu_and_torch(tmp_path: Path) -> None:
    book.record_machine(tmp_path)
    info = json.loads((tmp_path / book.MACHINE_FILE).read_text())
    assert info["cores"] >= 1 and info["torch"] and info["date"].endswith("UTC")
    note = book.describe_machine(info)
    assert info["cpu"] in note and info["torch"] in note
