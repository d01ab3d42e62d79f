"""Answer keys stay out of learners' reach, each course gets its own, and self-paced grading works.

COURSE.md, "Grades that mean something": nothing a student can run tells right from wrong before
grading; numbers and answer order come from a course seed; a learner can grade their own work locally.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import nbformat
import pytest

from minengine.course import grading
from minengine.course import tooling as course
from minengine.course.autograde_pool import default_workers
from minengine.course.templating import (
    DEFAULT_COURSE_SEED,
    LETTERS,
    MIN_CLASS_SEED_BITS,
    TemplateError,
    _find_choice_lists,
    _orders,
    load_params,
    render_folder,
    render_notebook,
    resolve_seeded_marks,
    seed_number,
    seed_strength_bits,
)

ROOT = Path(__file__).resolve().parents[1]
SOURCES = grading.discover_sources()
QUIZZES = {a: p for a, p in SOURCES.items() if p.parent.name == "quizzes"}
HIDDEN = re.compile(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS\n?", re.S)
NUMBERS = [0.001, 0.5, 1, 2, 7, 42, 128, 295.2, 1000, 65536, 1e6, 1e9]


def notebook_of(folder: Path) -> Path:
    (nb,) = folder.glob("*.ipynb")
    return nb


def meta(cell: nbformat.NotebookNode) -> dict:
    return cell.metadata.get("nbgrader", {})


# --------------------------------------------------------------------------- nothing to recover
def candidate_answers() -> list[object]:
    """Everything a student could try in an answer cell: every letter combination and many numbers."""
    letters = ["".join(c) for n in (1, 2, 3, 4) for c in itertools.combinations("ABCD", n)]
    return [*letters, *NUMBERS]


@pytest.mark.parametrize("assignment", QUIZZES)
def test_no_visible_check_tells_right_from_wrong(tmp_path: Path, assignment: str) -> None:
    """Run every check cell of the student version with every candidate answer: a well-formed answer
    passes or fails the same whichever it is, so looping over answers recovers nothing."""
    release = grading.release(tmp_path / "course", {assignment: SOURCES[assignment]}, seed=11)[assignment]
    nb = nbformat.read(notebook_of(release), as_version=4)
    assert "@@" not in nbformat.writes(nb)
    checked = 0
    for i, cell in enumerate(nb.cells):
        if not meta(cell).get("grade") or cell.cell_type != "code":
            continue
        assert "BEGIN HIDDEN" not in cell.source
        names = sorted(set(re.findall(r'globals\(\)\.get\("(\w+)"\)', cell.source)))
        assert names, f"check cell {meta(cell).get('grade_id')} reads no answer"
        outcomes: dict[str, set[bool]] = {}
        for value in candidate_answers():
            ns: dict[str, object] = {name: value for name in names}
            try:
                exec(compile(cell.source, f"<{assignment} cell {i}>", "exec"), ns)
                passed = True
            except AssertionError:
                passed = False
            form = ("one letter" if len(value) == 1 else "letters") if isinstance(value, str) else "number"
            outcomes.setdefault(form, set()).add(passed)
        # Within each form (one letter, several letters, a number) every candidate gets the same verdict.
        assert all(len(v) == 1 for v in outcomes.values()), (meta(cell)["grade_id"], outcomes)
        checked += 1
    assert checked >= 8


def test_the_installed_package_holds_no_answer_material() -> None:
    """No key, salt or hidden case in anything a student kernel can import."""
    package = ROOT / "minengine"
    text = "\n".join(p.read_text() for p in package.rglob("*.py"))
    for pattern in (r"SALT\s*=", r"(choice|number|answer)_digest", r"hidden_cases", r"ANSWER_KEY",
                    r"_lab1_models", r"lab1_check_"):
        assert not re.search(pattern, text), pattern
    assert not list(package.rglob("params.py")), "an assignment's key maker must not be installed"


# -------------------------------------------------------------------------------- per-course keys
@pytest.mark.parametrize("assignment", SOURCES)
def test_each_course_seed_renders_its_own_answers(tmp_path: Path, assignment: str) -> None:
    src = SOURCES[assignment]
    views = []
    for seed in (DEFAULT_COURSE_SEED, 2):  # the public seed's slow params are read from disk once kept
        out = render_folder(src, tmp_path / str(seed), seed)
        (rendered,) = out.values()
        text = json.dumps(rendered.notebook)
        assert "@@" not in text
        views.append((rendered.keys, rendered.params, text))
    assert views[0][2] != views[1][2], "two courses got the same notebook"
    if views[0][0] or views[1][0]:
        assert views[0][0] != views[1][0], "two courses got the same answer letters"
    assert not (tmp_path / "2" / "params.py").exists()


@pytest.fixture(scope="module")
def second_class(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], grading.Score]:
    """A class on seed 424242: the sources as students, and each quiz's answer sheet rendered from the
    public sources (the default seed) copied in by another student."""
    tmp_path = tmp_path_factory.mktemp("second_seed")
    course_dir = tmp_path / "course"
    grading.release(course_dir, SOURCES, timeout=30, seed=424242)
    assert grading.course_seed(course_dir) == 424242  # kept for later releases and regrades
    for assignment in SOURCES:
        grading.submit("solution", [notebook_of(course_dir / "source" / assignment)], course_dir)
        if assignment in QUIZZES:
            public = tmp_path / "public" / assignment
            (sheet,) = render_folder(SOURCES[assignment], public, DEFAULT_COURSE_SEED)
            copy_by_option(public / sheet, SOURCES[assignment], 424242)
            grading.submit("copied", [public / sheet], course_dir)
    return {(s.student, s.assignment): s for s in grading.autograde(course_dir, workers=default_workers())}


def right_options(src: Path, seed: int | str) -> dict[str, frozenset[int]]:
    """Each choice list's right options, as indices into the source's option list, for one course."""
    nb = json.loads(notebook_of(src).read_text())
    lists = _find_choice_lists(resolve_seeded_marks(nb["cells"], load_params(src, seed)))
    return {c.qid: frozenset(i for i, (right, _) in enumerate(c.options) if right) for c in lists}


def copy_by_option(sheet: Path, src: Path, seed: int | str) -> None:
    """Turn a public answer sheet into what a student of the course on ``seed`` copies from it: the same
    *options* as the sheet's (matched by their text, whatever letter they have there), and the same
    numbers. That beats the shuffled letters; only a right option that follows from the course's own
    scenario does not."""
    nb = json.loads(sheet.read_text())
    name = f"{src.name}/{notebook_of(src).name}"
    public = right_options(src, DEFAULT_COURSE_SEED)
    cells = resolve_seeded_marks(json.loads(notebook_of(src).read_text())["cells"], load_params(src, seed))
    lists = _find_choice_lists(cells)
    orders = _orders(lists, seed_number(seed), name)
    letters = {c.qid: "".join(LETTERS[k] for k, j in enumerate(orders[c.qid]) if j in public[c.qid])
               for c in lists}
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "BEGIN SOLUTION" in "".join(cell["source"]):
            cell["source"] = re.sub(r'^(q\d+) = "[A-H]+"$',
                                    lambda m: f'{m.group(1)} = "{letters[m.group(1)]}"',
                                    "".join(cell["source"]), flags=re.M)
    sheet.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def test_a_second_course_seed_still_gives_the_source_full_marks(second_class: dict) -> None:
    solutions = [s for (student, _), s in second_class.items() if student == "solution"]
    assert len(solutions) == len(SOURCES)
    for score in solutions:
        assert score.score == score.max_score > 0, score


# Every quiz's multiple-choice keys follow from each course's scenario (params.py marks the right option), so
# a public answer sheet copied by option text earns little in another class.
COPIED_SHARE_LIMIT = 0.4  # a public sheet may earn this share of a quiz at most (guessing earns ~0.25 of MC)


@pytest.mark.parametrize("assignment", QUIZZES)
def test_a_public_answer_sheet_is_worth_little_in_another_class(second_class: dict, assignment: str) -> None:
    score = second_class["copied", assignment]
    assert score.score / score.max_score <= COPIED_SHARE_LIMIT, score


def quiz_points(src: Path) -> dict[str, float]:
    nb = json.loads(notebook_of(src).read_text())
    return {c["metadata"]["nbgrader"]["grade_id"].removeprefix("check_"): c["metadata"]["nbgrader"]["points"]
            for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")}


@pytest.mark.parametrize("assignment", QUIZZES)
def test_a_public_answer_sheet_earns_little_on_average(assignment: str) -> None:
    """Over many courses, the options a public sheet marks are right in a share of them no larger than the
    limit (numeric keys are seeded, so they count as wrong): one class's luck aside."""
    src = SOURCES[assignment]
    points, public = quiz_points(src), right_options(src, DEFAULT_COURSE_SEED)
    assert set(public) <= set(points)
    shares = []
    for seed in range(1, 101):
        course = right_options(src, seed)
        shares.append(sum(points[q] for q in course if course[q] == public[q]) / sum(points.values()))
    assert sum(shares) / len(shares) <= COPIED_SHARE_LIMIT, sum(shares) / len(shares)


@pytest.mark.parametrize("assignment", QUIZZES)
def test_answer_positions_are_balanced_and_the_longest_option_is_no_tell(assignment: str) -> None:
    src = SOURCES[assignment]
    nb = json.loads(notebook_of(src).read_text())
    for seed in (2026, 1, 2):
        params = load_params(src, seed)
        lists = [c for c in _find_choice_lists(resolve_seeded_marks(nb["cells"], params)) if not c.multi]
        assert len(lists) >= 5
        longest_right = sum(max(c.options, key=lambda o: len(o[1]))[0] for c in lists)
        assert longest_right <= len(lists) // 2, ("the right option is usually the longest one", seed)
        keys = render_notebook(nb, seed, params, assignment).keys
        counts = [sum(keys[c.qid] == letter for c in lists) for letter in LETTERS[:4]]
        assert max(counts) - min(counts) <= 1, (seed, counts)


def test_a_placeholder_without_a_value_stops_the_release() -> None:
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "source": "x = @@nothing@@"}]}
    with pytest.raises(TemplateError, match="@@nothing@@"):
        render_notebook(nb, 1, {})


def test_the_public_seeds_slow_params_are_kept_on_disk_and_a_class_seeds_never_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minengine.course import templating

    kept = tmp_path / "kept"
    monkeypatch.setenv(templating.PARAMS_DIR_ENV, str(kept))
    monkeypatch.setattr(templating, "KEEP_PARAMS_AFTER_S", 0.0)  # every computation counts as slow
    folder = tmp_path / "lab9_example"
    folder.mkdir()
    runs = tmp_path / "runs.txt"
    source = ("from pathlib import Path\n\nVALUE = {value}\n\n\ndef params(seed):\n"
              f"    with open({str(runs)!r}, 'a') as f:\n        f.write('x')\n"
              "    return {{'seed': seed, 'value': VALUE, 'families': [{{'rate': 2.5}}]}}\n")
    (folder / "params.py").write_text(source.format(value=1))

    def computed() -> int:
        return len(runs.read_text()) if runs.exists() else 0

    first = load_params(folder, DEFAULT_COURSE_SEED)
    assert first == {"seed": DEFAULT_COURSE_SEED, "value": 1, "families": [{"rate": 2.5}]}
    assert load_params(folder, DEFAULT_COURSE_SEED) == first and computed() == 1  # the second is read
    assert [p.name.split("-")[0] for p in kept.iterdir()] == ["lab9_example"]
    # A class seed's params are its secret: computed every time, never written anywhere.
    secret = 0x5EC2E7_5EED_C0FFEE
    assert load_params(folder, secret)["seed"] == secret == load_params(folder, secret)["seed"]
    assert computed() == 3 and len(list(kept.iterdir())) == 1
    # An edit to params.py is a new file name: nothing stale is read.
    (folder / "params.py").write_text(source.format(value=2))
    assert load_params(folder, DEFAULT_COURSE_SEED)["value"] == 2 and computed() == 4
    # A file cut short is computed again, not an error.
    for path in kept.iterdir():
        path.write_text('{"seed": 20')
    assert load_params(folder, DEFAULT_COURSE_SEED)["value"] == 2 and computed() == 5


# ------------------------------------------------------------------------------- self-paced grading
def test_make_grade_grades_your_own_notebook_with_feedback(tmp_path: Path, capsys: pytest.CaptureFixture
                                                           ) -> None:
    """A learner's filled-in quiz graded locally: hidden tests run, the score and the feedback come back."""
    (assignment, src), *_ = QUIZZES.items()
    course_dir = tmp_path / "course"
    release = grading.ensure_release(course_dir, {assignment: src})[assignment]
    solutions = {meta(c)["grade_id"]: c.source for c in
                 nbformat.read(notebook_of(course_dir / "source" / assignment), as_version=4).cells
                 if meta(c).get("solution")}
    mine = nbformat.read(notebook_of(release), as_version=4)
    for cell in mine.cells:
        if meta(cell).get("grade_id") in solutions:
            cell.source = re.sub(r"^\s*### (BEGIN|END) SOLUTION\s*$\n?", "",
                                 solutions[meta(cell)["grade_id"]], flags=re.M)
    path = tmp_path / "workspace" / notebook_of(release).name
    path.parent.mkdir()
    nbformat.write(mine, path)
    assert course.main(["grade", str(path), "--course-dir", str(course_dir), "--no-open"]) == 0
    out = capsys.readouterr().out
    total = re.search(r"score ([\d.]+) / ([\d.]+)", out)
    assert total and total.group(1) == total.group(2), out
    (page,) = re.findall(r"feedback \(why each answer is right\): (\S+)", out)
    html = Path(page).read_text()
    assert "grade_choice" in html or "grade_number" in html  # the hidden tests, with their explanations


# ------------------------------------------------------------------------------- a class's secret seed
@pytest.mark.parametrize(("argv", "env", "says"), [
    ([], {}, "a class needs a secret course seed"),  # the public default would render the keys for anyone
    (["--seed", "424242424242"], {}, "too easy to find (about 39 bits"),  # every seed up to it can be tried
    (["--seed", "spring2026"], {}, "too easy to find"),
    ([], {"MINENGINE_COURSE_SEED": "12345"}, "too easy to find"),
])
def test_a_class_release_refuses_a_seed_anyone_could_find(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                          env: dict[str, str], says: str) -> None:
    monkeypatch.delenv("MINENGINE_COURSE_SEED", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    course_dir = tmp_path / "course"
    assert course.main(["release", "--course-dir", str(course_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and "secrets.token_urlsafe" in err and "--public-seed" in err
    assert not course_dir.exists(), "nothing is released with a seed that gives the keys away"


def test_a_passphrase_seeds_a_class_and_the_public_seed_stays_for_self_study(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINENGINE_COURSE_SEED", raising=False)
    (assignment, _), *_ = QUIZZES.items()
    secret = "0r4nge-Gl4ss-T1ger-W1nter-88"
    assert seed_strength_bits(secret) >= MIN_CLASS_SEED_BITS
    assert seed_number(secret) == seed_number(f" {secret} ") != seed_number(secret + "!")  # text, hashed
    assert seed_number("424242") == 424242  # a number stays the number older classes used
    src = QUIZZES[assignment]  # every entry point renders a text seed as its number
    assert load_params(src, secret) == load_params(src, seed_number(secret))
    course_dir = tmp_path / "class"
    assert course.main(["release", "--course-dir", str(course_dir), "--assignment", assignment,
                        "--seed", secret]) == 0
    assert grading.course_seed(course_dir) == seed_number(secret)
    # the class's next release reuses the stored seed: no seed needs to be typed again
    assert course.main(["release", "--course-dir", str(course_dir), "--assignment", assignment]) == 0
    assert grading.course_seed(course_dir) == seed_number(secret)
    # self-paced use or a demo: the public default, on purpose
    public = tmp_path / "self-paced"
    assert course.main(["release", "--course-dir", str(public), "--assignment", assignment,
                        "--public-seed"]) == 0
    assert grading.course_seed(public) == DEFAULT_COURSE_SEED
