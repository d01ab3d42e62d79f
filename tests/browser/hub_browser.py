"""The hub in headless Chromium: a student's assignment list flow, and who sees nbgrader's instructor tools.

Used by tests/test_hub.py (its hub fixture owns the users and servers). Logs in through the hub's own
login page, then drives JupyterLab as a learner does: the Nbgrader menu, the Fetch and Submit buttons, the
notebook. Screenshots go to build/browser-artifacts/hub-*.png.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from jlab_helpers import (
    NOTEBOOK,
    find_cell,
    new_page,
    notebook_cells,
    run_async_js,
    screenshot,
    scroll_to_cell,
    wait_kernel_idle,
)

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    explicit = os.environ.get("MINENGINE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    names = ("chromium", "chromium-browser", "google-chrome")
    return next((p for n in names if (p := shutil.which(n))), None)


@contextmanager
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (the dev extra)")
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium found (as root on Debian `make test` installs it; "
                    "or set MINENGINE_CHROMIUM)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def login(chromium: Any, hub: Any, user: str) -> Any:
    """A page logged in as ``user`` through the hub's login form, on their JupyterLab."""
    page = new_page(chromium)
    page.goto(f"{hub.url}/hub/login", timeout=120_000)
    page.fill("#username_input", user)
    page.fill("#password_input", hub.password)
    page.click("#login_submit")
    page.wait_for_url(f"**/user/{user}/lab**", timeout=180_000)
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started !== undefined",
                           timeout=120_000)
    page.locator("#jp-main-statusbar").wait_for(timeout=120_000)
    return page


def open_assignment_list(page: Any) -> Any:
    """Nbgrader menu -> Assignment List, as a student finds it; returns the panel."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    panel = page.locator(".jp-MainAreaWidget:not(.lm-mod-hidden)", has_text="Released assignments")
    panel.wait_for(timeout=60_000)
    return panel


def student_flow_in_browser(hub: Any, student: str, lab: str, write_answers: Callable[[], None]) -> None:
    """Open the assignment list, fetch ``lab``, open its notebook, submit it; screenshots at each step.

    ``write_answers`` stands in for the typing (it saves the answers through the student's server, as
    JupyterLab's Save does), between opening the notebook and submitting.
    """
    with browser() as chromium:
        page = login(chromium, hub, student)
        panel = open_assignment_list(page)
        row = panel.locator("#released_assignments_list .list_item:not(.nested_list_item)", has_text=lab)
        row.wait_for(timeout=60_000)
        screenshot(page, "hub-student-1-assignment-list")
        row.get_by_role("button", name="Fetch").click()
        fetched = panel.locator("#fetched_assignments_list .list_item:not(.nested_list_item)", has_text=lab)
        fetched.wait_for(timeout=120_000)
        screenshot(page, "hub-student-2-fetched")
        write_answers()
        page.goto(f"{hub.url}/user/{student}/lab/tree/{lab}/{lab}.ipynb?reset", timeout=120_000)
        page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(timeout=120_000)
        wait_kernel_idle(page, 180)
        # The saved answers are what the notebook shows (the solution of the first answer cell).
        scroll_to_cell(page, find_cell(notebook_cells(page), r"def kv_bytes_per_token\("))
        page.locator(f"{NOTEBOOK} .jp-Cell", has_text="def kv_bytes_per_token").first.wait_for(timeout=60_000)
        run_async_js(page, "await window.jupyterapp.commands.execute('docmanager:save');", 60)  # Ctrl+S
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        screenshot(page, "hub-student-3-notebook")
        panel = open_assignment_list(page)
        fetched = panel.locator("#fetched_assignments_list .list_item:not(.nested_list_item)", has_text=lab)
        fetched.get_by_role("button", name="Submit").click()
        submitted = panel.locator("#submitted_assignments_list .list_item:not(.nested_list_item)",
                                  has_text=lab)
        submitted.wait_for(timeout=120_000)
        screenshot(page, "hub-student-4-submitted")
        page.context.close()


TOOLS_JS = """() => {
    const app = window.jupyterapp;
    return {create_assignment: app.commands.hasCommand('nbgrader:open-create-assignment')
                               || !!document.getElementById('nbgrader-create_assignemnt'),
            formgrader: app.commands.hasCommand('nbgrader:open-formgrader')
                        || app.commands.hasCommand('nbgrader:open-formgrader-local'),
            assignment_list: app.commands.hasCommand('nbgrader:open-assignment-list')};
}"""


def instructor_tools_in_browser(hub: Any, instructor: str, student: str, lab: str) -> dict[str, dict]:
    """What each sees: nbgrader's commands and the Create Assignment sidebar; screenshots of both labs
    (the instructor's with the formgrader open on the course, the student's Nbgrader menu)."""
    seen = {}
    with browser() as chromium:
        page = login(chromium, hub, instructor)
        page.wait_for_function("() => window.jupyterapp.commands.hasCommand('nbgrader:open-assignment-list')",
                               timeout=60_000)
        seen[instructor] = page.evaluate(TOOLS_JS)
        # Create Assignment works on the notebook in front: the instructor's rendered source of the lab.
        page.goto(f"{hub.url}/user/{instructor}/lab/tree/course/source/{lab}/{lab}.ipynb?reset",
                  timeout=120_000)
        page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(timeout=120_000)
        page.evaluate("() => window.jupyterapp.shell.activateById('nbgrader-create_assignemnt')")  # its tab
        page.locator("#nbgrader-create_assignemnt").wait_for(timeout=30_000)
        screenshot(page, "hub-instructor-lab")
        # The formgrader in a tab of its own: JupyterHub >= 4.1 forbids framing a user's server (its
        # CSP says frame-ancestors 'none'), so the Formgrader panel inside JupyterLab stays blank unless
        # the hub uses subdomains (deploy/jupyterhub/README.md).
        page.goto(f"{hub.url}/user/{instructor}/formgrader", timeout=120_000)
        page.locator("body", has_text=lab).wait_for(timeout=120_000)  # the course's assignment is listed
        screenshot(page, "hub-instructor-formgrader")
        page.context.close()

        page = login(chromium, hub, student)
        page.wait_for_function("() => window.jupyterapp.commands.hasCommand('nbgrader:open-assignment-list')",
                               timeout=60_000)
        seen["student"] = page.evaluate(TOOLS_JS)
        page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
        page.locator(".lm-Menu").first.wait_for()
        screenshot(page, "hub-student-menu")
        seen["student_menu"] = page.locator(".lm-Menu").first.inner_text()
        page.context.close()
    return seen
