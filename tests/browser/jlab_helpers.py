"""Driving JupyterLab from Playwright: open a notebook, wait for its kernel, run cells, read the outputs.

Notebook state is read from JupyterLab's own model (``window.jupyterapp``, exposed by the server flag
``--LabApp.expose_app_in_browser``), not scraped from the DOM: the model knows every cell's outputs even
when a long notebook has scrolled them away. What the learner sees is checked on the DOM (widget text,
images) and recorded in screenshots.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "browser-artifacts"
VIEWPORT = {"width": 1280, "height": 900}  # the screen the course must stay readable on
NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden)"
RUN_ALL_S = 240  # tests/test_lessons.py's hard limit for one lesson on a loaded 2-core machine
KERNEL_BUSY_WORDS = ("Connecting", "Initializing", "Starting", "No Kernel", "Unknown", "Restarting")

# The active notebook panel, or an error naming what is in front instead.
_PANEL_JS = """
const app = window.jupyterapp;
const panel = app.shell.currentWidget;
if (!panel || !panel.content || !panel.content.model) throw new Error('no notebook in front');
"""


@dataclass
class LabServer:
    """A running JupyterLab: where it serves, its token, the course copy it serves, its log."""

    port: int
    token: str
    root: Path
    log: Path
    process: subprocess.Popen

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str) -> str:
        """The page that opens ``path`` (relative to the course copy) in a fresh layout (``?reset``)."""
        return f"{self.base}/lab/tree/{path}?reset&token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def new_page(browser: Any) -> Any:
    """A page in its own context at 1280x900, with generous default timeouts for a busy 2-core machine."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(30_000)
    return context.new_page()


def open_notebook(page: Any, server: LabServer, path: str, timeout_s: float = 120) -> Any:
    """Open ``path`` in a fresh layout and wait until its kernel is really idle; returns the panel locator."""
    page.goto(server.url(path), timeout=timeout_s * 1000)
    panel = page.locator(NOTEBOOK)
    panel.wait_for(state="visible", timeout=timeout_s * 1000)
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for(timeout=timeout_s * 1000)
    wait_kernel_idle(page, timeout_s)
    return panel


@dataclass
class RanNotebook:
    """A notebook open in its own page after Run All Cells: the page, the run's outcome, the cells."""

    page: Any
    finished: bool
    cells: list[dict]


def run_notebook(browser: Any, server: LabServer, path: str, timeout_s: float) -> Iterator[RanNotebook]:
    """Open ``path`` in a new page, Run All Cells, yield the result, close the page (a fixture's body:
    one run of a lesson shared by a module's tests). Skips when the notebook is not in the course."""
    import pytest

    if not (server.root / path).exists():
        pytest.skip(f"{path} is not in the course (yet)")
    page = new_page(browser)
    try:
        open_notebook(page, server, path)
        finished = run_all(page, timeout_s)
        yield RanNotebook(page, finished, notebook_cells(page))
    finally:
        page.context.close()
        shut_down_kernel(server, path)


def open_sessions(server: LabServer) -> dict[str, str]:
    """The server's notebook sessions: notebook path -> session id."""
    import httpx

    sessions = httpx.get(f"{server.base}/api/sessions", timeout=10,
                         headers={"Authorization": f"token {server.token}"}).json()
    return {s.get("path") or s.get("notebook", {}).get("path"): s["id"] for s in sessions}


def shut_down_kernel(server: LabServer, path: str | None = None) -> None:
    """Shut down the kernel of the notebook at ``path`` (every notebook's, when None) once its test is done.
    Each lesson's kernel holds a model and what its experiments built (0.9-3.5 GB each here); kept to the
    end of the module, the finished lessons' kernels held ~14 GB of this 23 GB machine by the eighth
    lesson."""
    import httpx

    try:
        for notebook, session in open_sessions(server).items():
            if path is None or notebook == path:
                httpx.delete(f"{server.base}/api/sessions/{session}", timeout=30,
                             headers={"Authorization": f"token {server.token}"})
    except httpx.HTTPError as exc:  # clean-up only: never hide a test's own result
        print(f"could not shut the kernel of {path or 'every notebook'} down: {exc}")


def wait_changed(page: Any, selector: str, before: str, attribute: str | None = None,
                 timeout_ms: float = 30_000) -> None:
    """Wait until ``selector``'s innerText (as ``inner_text()`` reads it), or ``attribute``, is not
    ``before``."""
    page.wait_for_function("""([sel, before, attr]) => {
        const el = document.querySelector(sel);
        if (!el) return false;
        const now = attr ? el.getAttribute(attr) : el.innerText;
        return now !== null && now !== before;
    }""", arg=[selector, before, attribute], timeout=timeout_ms)


def wait_kernel_idle(page: Any, timeout_s: float = 120) -> None:
    """Wait for the status bar to say ``| Idle`` and the session's kernel to agree.

    The toolbar's indicator turns idle before the kernel is usable; "run all" then silently skips cells.
    """
    words = json.dumps(list(KERNEL_BUSY_WORDS))
    page.wait_for_function(f"""() => {{
        const bar = document.querySelector('#jp-main-statusbar');
        if (!bar || !bar.textContent.includes('| Idle')) return false;
        if ({words}.some(w => bar.textContent.includes(w))) return false;
        const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
        const kernel = panel && panel.sessionContext && panel.sessionContext.session
            && panel.sessionContext.session.kernel;
        return !!kernel && kernel.status === 'idle';
    }}""", timeout=timeout_s * 1000)


def run_async_js(page: Any, body: str, timeout_s: float) -> Any:
    """Run async JavaScript in the page and wait at most ``timeout_s`` for it (``evaluate`` has no limit).

    ``body`` is the inside of an async function; its return value (JSON-able) comes back.
    """
    page.evaluate("""body => {
        window.__meDone = undefined;
        const fn = new Function('return (async () => {' + body + '})()');
        fn().then(value => { window.__meDone = {value: value === undefined ? null : value}; },
                  error => { window.__meDone = {error: String(error && error.stack || error)}; });
    }""", body)
    page.wait_for_function("() => window.__meDone !== undefined", timeout=timeout_s * 1000, polling=250)
    done = page.evaluate("() => window.__meDone")
    if "error" in done:
        raise RuntimeError(f"JavaScript failed in the page: {done['error']}")
    return done["value"]


def run_all(page: Any, timeout_s: float) -> bool:
    """Run every cell (as Run > Run All Cells does); True when no cell stopped the run."""
    wait_kernel_idle(page)
    return bool(run_async_js(page, "return await window.jupyterapp.commands.execute("
                                   "'notebook:run-all-cells');", timeout_s))


def run_cells(page: Any, indices: list[int], timeout_s: float) -> None:
    """Run the given cells one after another, as a learner clicking into each and pressing Shift+Enter."""
    wait_kernel_idle(page)
    run_async_js(page, _PANEL_JS + f"""
        for (const i of {json.dumps(indices)}) {{
            panel.content.activeCellIndex = i;
            const ok = await app.commands.execute('notebook:run-cell');
            if (!ok) throw new Error('cell ' + i + ' failed');
        }}""", timeout_s)


def notebook_cells(page: Any) -> list[dict]:
    """Every cell of the notebook in front: type, source, execution count, outputs (as nbformat JSON)."""
    return page.evaluate("() => {" + _PANEL_JS + """
        const cells = [];
        const list = panel.content.model.cells;
        for (let i = 0; i < list.length; i++) {
            const c = list.get(i);
            cells.push({index: i, type: c.type, source: c.sharedModel.getSource(),
                        execution_count: c.type === 'code' ? c.executionCount : null,
                        outputs: c.type === 'code' ? c.outputs.toJSON() : [],
                        nbgrader: c.getMetadata('nbgrader') || null});
        }
        return cells;
    }""")


def problems(cells: list[dict]) -> list[str]:
    """What a learner would read as "something went wrong": error outputs and printed tracebacks."""
    found = []
    for cell in cells:
        for out in cell["outputs"]:
            if out.get("output_type") == "error":
                found.append(f"cell {cell['index']}: {out.get('ename')}: {out.get('evalue')}")
            elif out.get("output_type") == "stream" and "Traceback" in _text(out):
                found.append(f"cell {cell['index']}: printed a traceback: {_text(out)[-500:]}")
    return found


def stderr_texts(cells: list[dict]) -> list[str]:
    """Text written to stderr (JupyterLab shows it on a red background, which looks like an error)."""
    return [f"cell {c['index']}: {_text(o).strip()[:300]}" for c in cells for o in c["outputs"]
            if o.get("output_type") == "stream" and o.get("name") == "stderr" and _text(o).strip()]


def not_run(cells: list[dict]) -> list[int]:
    """Code cells with source that have no execution count (skipped, or the run stopped before them)."""
    return [c["index"] for c in cells if c["type"] == "code" and c["source"].strip()
            and c["execution_count"] is None]


def check_clean(name: str, finished: bool, cells: list[dict]) -> None:
    """Every code cell ran, none failed, nothing was written in red."""
    found = problems(cells)
    assert not found, f"{name}: errors in the browser:\n" + "\n".join(found)
    assert finished, f"{name}: Run All Cells stopped early"
    assert not not_run(cells), f"{name}: cells never ran: {not_run(cells)}"
    noisy = stderr_texts(cells)
    assert not noisy, f"{name}: stderr (JupyterLab shows it in red, like an error) in:\n" + "\n".join(noisy)


def cells_with_images(cells: list[dict]) -> list[int]:
    return [c["index"] for c in cells if any("image/png" in o.get("data", {}) for o in c["outputs"])]


def expect_visible_image(page: Any) -> None:
    """At least one rendered plot is on screen (not just in the model): an <img> with a real size."""
    page.wait_for_function(f"""() => [...document.querySelectorAll('{NOTEBOOK} .jp-OutputArea-output img')]
        .some(img => {{ const r = img.getBoundingClientRect();
                        return img.naturalWidth > 100 && r.bottom > 0 && r.top < window.innerHeight; }})""")


def find_cell(cells: list[dict], pattern: str) -> int:
    """Index of the first code cell whose source matches ``pattern`` (a regular expression)."""
    for cell in cells:
        if cell["type"] == "code" and re.search(pattern, cell["source"]):
            return cell["index"]
    raise AssertionError(f"no code cell matches {pattern!r}")


def scroll_to_cell(page: Any, index: int) -> None:
    """Bring cell ``index`` into view (the notebook scrolls inside its panel, not the page)."""
    page.evaluate("i => {" + _PANEL_JS + """
        panel.content.activeCellIndex = i;
        panel.content.widgets[i].node.scrollIntoView({block: 'start'});
    }""", index)
    page.wait_for_timeout(300)  # let lazily rendered outputs paint before a screenshot


def set_cell_source(page: Any, index: int, text: str) -> str:
    """Replace cell ``index``'s code the way a learner pastes it: focus its editor, select all, insert text.

    Returns the cell's source afterwards as JupyterLab's model holds it.
    """
    # Tag the cell's node: with notebook windowing, DOM order need not match cell indices.
    page.evaluate("i => {" + _PANEL_JS + """
        document.querySelectorAll('[data-me-target]').forEach(el => el.removeAttribute('data-me-target'));
        panel.content.activeCellIndex = i;
        const node = panel.content.widgets[i].node;
        node.scrollIntoView({block: 'center'});
        node.setAttribute('data-me-target', '1');
    }""", index)
    editor = page.locator(f"{NOTEBOOK} .jp-Cell[data-me-target] .cm-content")
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(text)  # no key events: no auto-indent or auto-closing brackets
    page.keyboard.press("Escape")  # back to command mode, as after typing
    return page.evaluate("i => {" + _PANEL_JS
                         + "return panel.content.model.cells.get(i).sharedModel.getSource();}", index)


def screenshot(page: Any, name: str) -> Path:
    """Save what the learner sees now as ``build/browser-artifacts/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def _text(output: dict) -> str:
    text = output.get("text", "")
    return "".join(text) if isinstance(text, list) else text


def stream_text(cells: list[dict]) -> str:
    """Everything the notebook's cells printed (stdout and stderr streams), in order."""
    return "".join("".join(o.get("text", "")) for c in cells for o in c["outputs"]
                   if o.get("output_type") == "stream")


def check_claims(name: str, cells: list[dict]) -> None:
    """The lesson's claim checks ran and printed, and none that must hold failed in this run."""
    from minengine.course.claims import FAILED_MARKER

    text = stream_text(cells)
    assert "as expected:" in text or "this machine differs:" in text, \
        f"{name}: the claim checks printed nothing"
    lines = text.splitlines()  # a failed claim's line, then the line that says why it may differ
    failed = ["\n".join(lines[i:i + 2]) for i, line in enumerate(lines) if line.startswith(FAILED_MARKER)]
    assert not failed, f"{name}: a must-hold claim failed in the browser run:\n" + "\n".join(failed)


def show_output(page: Any, index: int) -> None:
    """Scroll so that cell ``index``'s output (its plot), not its code, starts at the top of the view."""
    scroll_to_cell(page, index)
    page.evaluate("""i => {
        const panel = window.jupyterapp.shell.currentWidget;
        panel.content.widgets[i].outputArea.node.scrollIntoView({block: 'start'});
    }""", index)
    page.wait_for_timeout(300)
    expect_visible_image(page)


def show_widget(ran: RanNotebook, cell_pattern: str, selector: str, timeout_ms: float) -> Any:
    """Scroll the widget made by the cell matching ``cell_pattern`` to the top and return its locator."""
    scroll_to_cell(ran.page, find_cell(ran.cells, cell_pattern))
    widget = ran.page.locator(selector)
    widget.wait_for(state="visible", timeout=timeout_ms)
    widget.evaluate("el => el.scrollIntoView({block: 'start'})")
    ran.page.wait_for_timeout(300)
    return widget
