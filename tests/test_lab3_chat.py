"""Lab 3's ungraded last section: the learner's own server (the source's solution here) chats through the
official ``openai`` SDK on the model the course's switch picks, and does nothing while grading.

The two cells are run as the notebook runs them (their source, in a namespace holding the notebook's
``server_grader``), against the solution's ``build_app`` started by ``server_grader`` itself, so the
test breaks if the cells, the switch or the runner drift apart.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import httpx
import nbformat
import pytest

from minengine.course import lessons as lu
from minengine.course import server_grader as sg
from minengine.course.templating import render_source

LAB = Path(__file__).resolve().parents[1] / "labs" / "lab3_streaming_server" / "lab3_streaming_server.ipynb"
CELLS = nbformat.from_dict(render_source(LAB)).cells  # as released for the public seed (its KV budget)


def cell_with(marker: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in CELLS if c.cell_type == "code" and marker in c.source]
    return cell


CONNECT, CHAT = cell_with("lu.lesson_model()"), cell_with("bot.chat.completions.create(")


def run_section() -> str:
    """Both cells, in order, in one namespace (as a kernel would); what they printed."""
    namespace = {"server_grader": sg}
    out = io.StringIO()
    with redirect_stdout(out):
        exec(CONNECT.source, namespace)  # noqa: S102 (the notebook's own cells)
        exec(CHAT.source, namespace)  # noqa: S102
    return out.getvalue()


def test_the_section_is_ungraded_and_skipped_while_grading(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "nbgrader" not in CONNECT.metadata and "nbgrader" not in CHAT.metadata  # no points, no lock

    def no_server(*_: object, **__: object) -> None:
        raise AssertionError("the section reached for a server while grading")

    monkeypatch.setattr(sg, "server", no_server)
    for mode in ("autograde", "validate"):
        monkeypatch.setenv("NBGRADER_EXECUTION", mode)
        printed = run_section()
        assert "Skipped while grading" in printed and "through your server" not in printed


@pytest.fixture(scope="module")
def answer_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The source's solution written as lab3_server.py (what its %%writefile cell does), served on both
    models by the grader's runner. The reference server is not needed here, so none is started."""
    (answer,) = [c for c in CELLS if c.metadata.get("nbgrader", {}).get("grade_id") == "answer_server"]
    code = "\n".join(line for line in answer.source.splitlines()[1:]
                     if not re.match(r"\s*### (BEGIN|END) SOLUTION", line))
    folder = tmp_path_factory.mktemp("lab3")
    (folder / "lab3_server.py").write_text(code + "\n")
    sg.stop_all()
    sg._RUNNING["reference"] = sg.ServerProcess(None, (sg.TINY,))  # a placeholder, never started
    sg.launch(folder / "lab3_server.py", models=(sg.TINY, sg.SMOL))
    try:
        yield folder
    finally:
        sg.stop_all()


@pytest.mark.slow
@pytest.mark.parametrize("switch", ["", "tiny"])
def test_the_learners_server_chats_on_the_model_the_switch_picks(answer_served: Path, switch: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(answer_served)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv(lu.LESSON_MODEL_ENV, switch)
    expected = lu.lesson_model().name
    assert expected == (sg.SMOL if not switch else sg.TINY)  # make installs SmolLM2 (test_lesson_model)
    printed = run_section()
    assert f"your server serves {expected}" in printed, printed
    match = re.search(rf"\n\n\({re.escape(expected)} through your server: first text after (\d+) ms, "
                      r"(\d+) pieces",
                      printed)
    assert match and int(match.group(2)) >= 5, printed
    # what streamed is the greedy answer the same server gives without streaming
    question = re.search(r'QUESTION = "([^"]+)"', CHAT.source).group(1)
    system = re.search(r'"system", "content": "([^"]+)"', CHAT.source).group(1)
    whole = httpx.post(sg.server().url(expected) + "/v1/chat/completions", timeout=60, json={
        "model": expected, "max_tokens": 32, "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}).json()
    streamed = printed[printed.index("\n", printed.index("your server serves")) + 1:match.start()]
    assert streamed == whole["choices"][0]["message"]["content"], printed
