"""Lab 3's student version in JupyterLab: nbgrader's Validate button fails it blank and passes it solved.

As for lab 1 (test_browser_lab_validate.py, whose helpers this reuses), but this lab's checks are black
box: Validate runs the notebook, whose launch cell starts the learner's server and the reference server
in subprocesses, and the visible checks talk to them over HTTP. Blank, ``build_app`` raises
NotImplementedError when the grader's runner calls it, so every server check reports that the server
did not start; pasted in, the reference answers pass, and the last cell stops both servers.
"""

from __future__ import annotations

from typing import Any

import nbformat
import pytest
from jlab_helpers import NOTEBOOK, ROOT, notebook_cells, open_notebook, screenshot, set_cell_source
from test_browser_lab_validate import click_validate, close_dialog, reference_answers

LAB = "lab3_streaming_server"
STUDENT_PATH = f"labs/{LAB}/{LAB}.ipynb"
SOURCE = ROOT / "labs" / LAB / f"{LAB}.ipynb"


@pytest.mark.timeout(600)
def test_lab3_validate_fails_blank_and_passes_with_the_answers(page: Any, lab_server: Any) -> None:
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
    assert set(answer_cells) == set(answers) == {"answer_server", "answer_client"}
    assert all("NotImplementedError" in cells[i]["source"] for i in answer_cells.values())

    # Unedited: the server's build_app and the client are stubs, so validation reports failures.
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-failed" in (message.get_attribute("class") or ""), text[:2000]
    assert "NotImplementedError" in text and "did not start" in text, text[:2000]
    screenshot(page, "lab3_validate_blank_fails")
    close_dialog(page)

    # Solved: paste the reference answers (the %%writefile server and the client), validate again.
    for grade_id, index in answer_cells.items():
        typed = set_cell_source(page, index, answers[grade_id])
        assert typed == answers[grade_id], f"the editor changed the pasted answer for {grade_id}"
    message = click_validate(page)
    text = message.inner_text()
    assert "validation-success" in (message.get_attribute("class") or ""), text[:3000]
    assert "Success! Your notebook passes all the tests." in text
    screenshot(page, "lab3_validate_solved_passes")
    close_dialog(page)
    saved = nbformat.read(lab_server.root / STUDENT_PATH, as_version=4)
    assert "NotImplementedError" not in "".join(saved.cells[i].source for i in answer_cells.values())
    assert (lab_server.root / "labs" / LAB / "lab3_server.py").is_file()  # the server cell wrote the file
