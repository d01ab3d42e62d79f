"""Every lab's student version in JupyterLab: nbgrader's Validate button fails it blank and passes it solved.

Self-paced learners check a lab with the *Validate* button that nbgrader's lab extension adds to the
notebook toolbar; it saves the notebook and asks nbgrader's server extension to run it. This test clicks
that button on the unedited student version (the answers are stubs: validation must fail), then types the
reference answers into the answer cells, as a learner pasting code would, and clicks it again (it must
pass). The reference answers come from the nbgrader source in ``labs/`` with the solution markers removed.

Lab 2: blank, ``MyPolicy``'s class body is the stub, so every check that runs the policy fails with a
NameError. Lab 3's checks are black box: the launch cell starts the learner's server and the reference
server in subprocesses; blank, ``build_app`` raises NotImplementedError in the grader's runner, so every
server check says the server did not start; solved, the last cell stops both servers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat
import pytest
from jlab_helpers import NOTEBOOK, ROOT, notebook_cells, open_notebook, screenshot, set_cell_source

from minengine.course.templating import render_source

# lab -> (its answer cells, or None: whatever the source has; what the blank run's message must say)
LABS = {
    "lab1_kv_calculator": (None, ("NotImplementedError",)),
    "lab2_batching_scheduler": ({"answer_policy", "answer_explanation"}, ("MyPolicy", "not defined")),
    "lab3_streaming_server": ({"answer_server", "answer_client", "answer_load", "answer_load_explanation"},
                              ("NotImplementedError", "did not start")),
}
VALIDATE_MS = 180_000  # nbgrader runs the whole notebook in a fresh kernel


def reference_answers(source: Path) -> dict[str, str]:
    """grade_id -> the code a learner who solved the cell would have (the solution, markers removed), with
    the numbers of the public seed the learner's version was released with (lab 3's KV budget)."""
    answers = {}
    for cell in nbformat.from_dict(render_source(source)).cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("solution"):
            lines = [ln for ln in cell.source.splitlines()
                     if ln.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def click_validate(page: Any) -> Any:
    """Press Validate and wait for nbgrader's result dialog; returns the dialog's message element."""
    button = page.locator(f"{NOTEBOOK} .validate-button")
    button.click()
    message = page.locator(".jp-Dialog #validation-message")
    message.wait_for(state="visible", timeout=VALIDATE_MS)
    return message


def close_dialog(page: Any) -> None:
    page.locator(".jp-Dialog .jp-mod-accept").click()
    page.locator(".jp-Dialog").wait_for(state="detached")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("lab", LABS)
def test_validate_fails_blank_and_passes_with_the_answers(page: Any, lab_server: Any, lab: str) -> None:
    student_path = f"labs/{lab}/{lab}.ipynb"
    if not (lab_server.root / student_path).exists():
        pytest.skip(f"{student_path} is not in the course")
    expected_cells, blank_says = LABS[lab]
    open_notebook(page, lab_server, student_path)
    button = page.locator(f"{NOTEBOOK} .validate-button")
    button.wait_for(state="visible")  # nbgrader's lab extension is loaded and hooked into notebooks
    assert button.inner_text().strip() == "Validate"

    cells = notebook_cells(page)
    assert "BEGIN SOLUTION" not in "".join(c["source"] for c in cells), "the learner got the source version"
    answers = reference_answers(ROOT / "labs" / lab / f"{lab}.ipynb")
    answer_cells = {c["nbgrader"]["grade_id"]: c["index"] for c in cells
                    if c["nbgrader"] and c["nbgrader"].get("solution")}
    assert set(answer_cells) == set(answers), "the student version's answer cells differ from the source's"
    assert expected_cells is None or set(answer_cells) == expected_cells
    assert all("NotImplementedError" in cells[i]["source"] for i in answer_cells.values())

    # Unedited: every code question is a stub, so validation reports failures.
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-failed" in (message.get_attribute("class") or ""), text[:2000]
    assert all(s in text for s in blank_says), text[:2000]
    screenshot(page, f"{lab}_validate_blank_fails")
    close_dialog(page)

    # Solved: paste the reference answers in, then validate again (the button saves the notebook first).
    for grade_id, index in answer_cells.items():
        typed = set_cell_source(page, index, answers[grade_id])
        assert typed == answers[grade_id], f"the editor changed the pasted answer for {grade_id}"
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-success" in (message.get_attribute("class") or ""), text[:3000]
    assert "Success! Your notebook passes all the tests." in text
    screenshot(page, f"{lab}_validate_solved_passes")
    close_dialog(page)
    saved = nbformat.read(lab_server.root / student_path, as_version=4)
    assert "NotImplementedError" not in "".join(saved.cells[i].source for i in answer_cells.values())
    if lab == "lab3_streaming_server":
        assert (lab_server.root / "labs" / lab / "lab3_server.py").is_file()  # the server cell wrote it
