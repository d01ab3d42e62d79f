"""Lab 2's student version in JupyterLab: nbgrader's Validate button fails it blank and passes it solved.

As for lab 1 (test_browser_lab_validate.py, whose helpers this reuses). Blank, ``MyPolicy``'s class body
is the stub, so defining the class raises NotImplementedError and every check that runs the policy fails
with a NameError; pasted in, the reference policy and explanation pass every visible check (the toy
workload, the steady stream, the blindness probe, the real engine, the practice simulation).
"""

from __future__ import annotations

from typing import Any

import nbformat
import pytest
from jlab_helpers import NOTEBOOK, ROOT, notebook_cells, open_notebook, screenshot, set_cell_source
from test_browser_lab_validate import click_validate, close_dialog, reference_answers

LAB = "lab2_batching_scheduler"
STUDENT_PATH = f"labs/{LAB}/{LAB}.ipynb"
SOURCE = ROOT / "labs" / LAB / f"{LAB}.ipynb"


@pytest.mark.timeout(600)
def test_lab2_validate_fails_blank_and_passes_with_the_answers(page: Any, lab_server: Any) -> None:
    if not (lab_server.root / STUDENT_PATH).exists():
        pytest.skip(f"{STUDENT_PATH} is not in the course")
    open_notebook(page, lab_server, STUDENT_PATH)
    button = page.locator(f"{NOTEBOOK} .validate-button")
    button.wait_for(state="visible")
    cells = notebook_cells(page)
    assert "BEGIN SOLUTION" not in "".join(c["source"] for c in cells), "the learner got the source version"
    answers = reference_answers(SOURCE)
    answer_cells = {c["nbgrader"]["grade_id"]: c["index"] for c in cells
                    if c["nbgrader"] and c["nbgrader"].get("solution")}
    assert set(answer_cells) == set(answers) == {"answer_policy", "answer_explanation"}
    assert all("NotImplementedError" in cells[i]["source"] for i in answer_cells.values())

    # Unedited: the policy is a stub, so every check that runs it reports a failure.
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-failed" in (message.get_attribute("class") or ""), text[:2000]
    assert "MyPolicy" in text and "not defined" in text, text[:2000]
    screenshot(page, "lab2_validate_blank_fails")
    close_dialog(page)

    # Solved: paste the reference policy and explanation, validate again (the button saves first).
    for grade_id, index in answer_cells.items():
        typed = set_cell_source(page, index, answers[grade_id])
        assert typed == answers[grade_id], f"the editor changed the pasted answer for {grade_id}"
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-success" in (message.get_attribute("class") or ""), text[:3000]
    assert "Success! Your notebook passes all the tests." in text
    screenshot(page, "lab2_validate_solved_passes")
    close_dialog(page)
    saved = nbformat.read(lab_server.root / STUDENT_PATH, as_version=4)
    assert "NotImplementedError" not in "".join(saved.cells[i].source for i in answer_cells.values())
