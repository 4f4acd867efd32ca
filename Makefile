# modnets — the two commands of the README:
#   make book   execute every notebook (cpu profile unless MODNETS_PROFILE says otherwise) and build _build/html
#   make test   unit tests + the book executed at smoke (every cell must run), built -W and audited
# Both create .venv when no virtualenv is active and install the project into it.

SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
# pip takes this torch from local disk here (CPU build); override e.g. TORCH_SPEC='torch>=2.3'.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= book,dev

ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := .venv
endif
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.modnets-installed

# Point the library at the shared datasets when they sit beside the checkout.
ifeq ($(origin MODNETS_DATA), undefined)
ifneq ($(wildcard ../shared/data),)
export MODNETS_DATA := $(abspath ../shared/data)
endif
endif
export PYDEVD_DISABLE_FILE_VALIDATION := 1
# The install compiles no bytecode (pip --no-compile; uv compiles none unless asked): each
# process compiles the modules it imports and keeps their bytecode for the next, and most of the
# installed files (packages' tests, servers) are never imported. For that, no recipe runs with
# PYTHONDONTWRITEBYTECODE.
unexport PYTHONDONTWRITEBYTECODE
# The CPU thread policy (modnets/threads.py, where the value is chosen): libgomp reads it when
# torch loads, so the notebooks' kernels get it from here.
export GOMP_SPINCOUNT ?= $(shell sed -n 's/^GOMP_SPINCOUNT = "\(.*\)"/\1/p' modnets/threads.py)

.PHONY: help install book reproduce publish test unit nbval book-check lint format bench bench-gpu equations sync audit book-smoke shots clean

help:
	@echo "make book    build the book into _build/html (executes every notebook, cached)"
	@echo "make reproduce  the evidence runs behind chapter 13 (hours; resumable; commit the records)"
	@echo "make test    unit tests + the book executed at the smoke profile (a failing cell fails it), built -W, and audited"
	@echo "make audit   audit the HTML of make book (what a reader sees); make shots: screenshots"
	@echo "make lint    ruff check + ruff format --check"
	@echo "make bench   run the benchmarks in bench/"
	@echo "make bench-gpu  the ratios on a GPU: float32 / bf16, eager / torch.compile"
	@echo "make equations  regenerate book/equations.md from modnets/equations.py"
	@echo "make sync    level each notebook with its script (notebooks/NN_name.py, the newer wins)"
	@echo "make publish push _build/html to the gh-pages branch (ghp-import; run make book first)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch alone through pip, which reads this machine's pip configuration (where the CPU build
# lies); its dependencies and the rest through uv, which installs in parallel what pip installs
# one package at a time (uv reads no pip configuration: it resolves on PyPI), or through pip
# where uv cannot be had or fails.
$(STAMP): pyproject.toml | $(PY)
	if ! $(PY) -c "import torch" 2>/dev/null; then
		$(PY) -m pip install -q --no-compile --no-deps "$(TORCH_SPEC)"
	fi
	if ! { $(PY) -m pip install -q --no-compile uv 2>/dev/null \
		&& $(BIN)/uv pip install -q --python $(PY) -e ".[$(EXTRAS)]"; }; then
		$(PY) -m pip install -q --no-compile -e ".[$(EXTRAS)]"
	fi
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

install: $(STAMP)

# MODNETS_PROGRESS=0: no progress bars in the pages (modnets.utils.progress); a live notebook
# and Colab keep them.
book: install
	MODNETS_PROGRESS=0 $(BIN)/jupyter-book build . -W --keep-going
	@echo "Book: $(abspath _build/html/index.html)"

# The evidence behind chapter 13's verdicts: hours at cpu, resumable (a seed with a record is
# not run again); EXPERIMENTS='fuzzy_boolean digits' limits it.
reproduce: install
	$(PY) -m modnets.reproduce --profile $${MODNETS_PROFILE:-cpu} $(if $(EXPERIMENTS),--experiments $(EXPERIMENTS))

# What a reader sees, checked without a browser: install cells, progress bars, warnings with
# temporary paths, lines wider than the content column, citation keys in a table of contents.
audit: install
	$(PY) tests/book_audit.py _build/html

# The book executed at the smoke profile (real outputs, in seconds) into _build/smoke, then
# audited: part of make test. Every cell runs once here: with allow_errors false a failing cell
# is a warning, which -W turns into a failed build (its traceback is printed from reports/);
# a cell gets 600 s at smoke.
# make nbval runs the same cells through pytest, one test per cell.
book-smoke: install
	mkdir -p _build/smoke
	$(PY) -c "import yaml; c = yaml.safe_load(open('_config.yml')); \
		c['execute']['execute_notebooks'] = 'force'; c['execute'].pop('cache'); \
		c['execute']['timeout'] = 600; \
		yaml.safe_dump(c, open('_build/smoke/_config.yml', 'w'))"
	MODNETS_PROFILE=smoke MODNETS_PROGRESS=0 $(BIN)/jupyter-book build . -W --keep-going \
		--config _build/smoke/_config.yml --path-output _build/smoke \
		|| { cat _build/smoke/_build/html/reports/*.err.log 2>/dev/null; exit 1; }
	$(PY) tests/book_audit.py _build/smoke/_build/html

# Screenshots of every chapter page at 1280 px, for a human look before a release (needs chromium).
shots:
	command -v chromium >/dev/null || { echo "make shots needs chromium" >&2; exit 1; }
	mkdir -p _build/shots
	for page in _build/html/book/*.html _build/html/notebooks/*.html; do
		chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,4000 \
			--screenshot=_build/shots/$$(basename $$page .html).png file://$(CURDIR)/$$page 2>/dev/null
	done
	@echo "screenshots in $(abspath _build/shots)"

# By hand, what .github/workflows/book.yml does on every push to main: the built book onto the
# gh-pages branch (GitHub Pages serves it; .nojekyll keeps Sphinx's _static folders).
publish: install
	test -f _build/html/index.html || { echo "no _build/html: run make book first" >&2; exit 1; }
	$(BIN)/ghp-import --no-jekyll --push --force _build/html

# Two test processes (pytest-xdist), each handed a test or two at a time, the long ones first
# (tests/conftest.py): neither is left running a long test after the other has finished. The
# nbval plugin (make nbval) is not loaded: importing it costs each test process 3 s.
unit: install
	$(BIN)/pytest -p no:nbval -n 2 --maxschedchunk 2 tests

nbval: install
	MODNETS_PROFILE=smoke $(BIN)/pytest -p no:cacheprovider --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 notebooks

# Structure, cross-references and bibliography, without executing anything again.
book-check: install
	mkdir -p _build/check
	$(PY) -c "import yaml; c = yaml.safe_load(open('_config.yml')); \
		c['execute']['execute_notebooks'] = 'off'; \
		yaml.safe_dump(c, open('_build/check/_config.yml', 'w'))"
	$(BIN)/jupyter-book build . -W --keep-going --config _build/check/_config.yml --path-output _build/check

# The unit tests and the smoke book run side by side, one thread each: both are streams of small
# steps that one thread runs nearly as fast as two, so on two cores the pair takes little more
# than the longer of the two. Each part's output is printed whole when it ends.
test: install
	$(MAKE) --no-print-directory lint
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory -j2 --output-sync=target unit book-smoke

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install
	$(PY) -m bench

bench-gpu: install
	$(PY) -m bench --profile gpu
	$(PY) -m bench --profile gpu --precision bfloat16
	$(PY) -m bench --profile gpu --compile
	$(PY) -m bench --profile gpu --precision bfloat16 --compile
	$(PY) -m bench --profile gpu --compare

# The equation index page is generated (tests/test_equations.py checks it is up to date).
equations: install
	$(PY) -m modnets.equations > book/equations.md.tmp
	mv book/equations.md.tmp book/equations.md

# The chapters are edited as percent-format scripts (notebooks/NN_name.py) paired with the
# notebooks by jupytext ([tool.jupytext] in pyproject.toml): the newer file of a pair wins.
sync: install
	$(BIN)/jupytext --sync notebooks/*.ipynb

clean:
	rm -rf _build .pytest_cache
