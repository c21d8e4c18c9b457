# Two entry points: `make lab` (install + open the course) and `make test`
# (install + run the whole test suite). Both build the local .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# A room without internet: fill a wheelhouse once where PyPI can be reached
# (`make wheelhouse`), carry the folder over, then `make install WHEELHOUSE=wheelhouse`
# installs from it alone (pip --no-index). docs/TEACHING.md has the recipe.
WHEELHOUSE ?=
PIP_FROM   := $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE))
PIP        := $(BIN)/python -m pip install --disable-pip-version-check -q $(PIP_FROM)

# PyTorch's CPU-only wheels instead of PyPI's (whose Linux torch pulls about 4 GiB of CUDA libraries a CPU
# course never uses): make install TORCH_INDEX=https://download.pytorch.org/whl/cpu (docs/TEACHING.md).
TORCH_INDEX ?=
TORCH_FROM  := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))

# Extra arguments for Jupyter, e.g. in a container: make lab LAB_ARGS="--ip 0.0.0.0 --no-browser".
# Jupyter refuses to start as root without --allow-root; containers often run as root.
LAB_ARGS ?=
USER_ID  ?= $(shell id -u)
LAB_ROOT := $(if $(filter 0,$(USER_ID)),--allow-root)

.PHONY: install lab demo test test-versions lint typecheck browser docs bench bench-quick evaluate wheelhouse figures answers slides learner-copy clean

$(STAMP): pyproject.toml requirements-torch.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -r requirements-torch.txt $(TORCH_FROM)
	$(PIP) -c requirements-torch.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Headless Chromium for the browser tests (widgets, slides) and npm for the slides' assets (Debian packages;
# no browser download by a test tool).
browser:
	@(command -v chromium && command -v npm) >/dev/null 2>&1 || bash scripts/install_chromium.sh

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/00_welcome.ipynb $(LAB_ROOT) $(LAB_ARGS)

# The projector demo: the explorers on the embedded models as one page without code (Voilà), at
# http://localhost:$(DEMO_PORT)/; Ctrl-C stops it. DEMO_ARGS as LAB_ARGS, e.g. in a container:
# make demo DEMO_ARGS="--Voila.ip=0.0.0.0 --no-browser". The page's template (no CDN link) is in notebooks/demo/share;
# only the widgets' extensions are loaded into the page (tests/widgets/test_demo_page.py runs the same arguments).
DEMO_PORT ?= 8866
DEMO_ARGS ?=
DEMO_OPTS := --template=projector --strip_sources=True \
	--VoilaConfiguration.extension_allowlist=@voila-dashboards/widgets-manager8 \
	--VoilaConfiguration.extension_allowlist=@jupyter-widgets/jupyterlab-manager
demo: $(STAMP)
	JUPYTER_PATH=$(CURDIR)/notebooks/demo/share $(BIN)/voila notebooks/demo/projector.ipynb $(DEMO_OPTS) --port=$(DEMO_PORT) $(DEMO_ARGS)

# The linter, the type checker and the documentation build run first: each fails the run on its first finding.
# Then every test, then the coverage tests at the other ends of the admitted transformers / timm ranges.
test: $(STAMP) browser lint typecheck docs
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-versions

# The decoder, encoder / ViT, families-of-2026 and VLM coverage tests at the lowest and the newest transformers and
# timm that pyproject.toml admits (lrp_core/runtime/versions.py), each installed with pip --target into
# .cache/versions and put first on PYTHONPATH over this venv; an end this venv already runs is tested by `make test`.
test-versions: $(STAMP)
	$(BIN)/python scripts/test_versions.py $(if $(PIP_FROM),--pip-args "$(PIP_FROM)")

# The documentation site (MkDocs): offline, warnings are errors, into site/. The notebooks are rendered
# from their stored outputs, not executed.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --quiet

# The linter and the format check (ruff, in the dev extra; its rules and line length are in pyproject.toml).
# `ruff format lrp_core widgets tests scripts` rewrites what the check refuses.
lint: $(STAMP)
	$(BIN)/python -m ruff check lrp_core widgets tests scripts
	$(BIN)/python -m ruff format --check lrp_core widgets tests scripts

# mypy over lrp_core and widgets, with the strictness of pyproject.toml's [tool.mypy] (docs/ARCHITECTURE.md).
typecheck: $(STAMP)
	$(BIN)/python -m mypy lrp_core widgets

# Every wheel `make install` needs, for this machine's Python and platform (run it
# on a machine like the room's). WHEELHOUSE_DIR is where they go.
WHEELHOUSE_DIR ?= wheelhouse
wheelhouse:
	$(PYTHON) -m pip download --disable-pip-version-check -q -d $(WHEELHOUSE_DIR) pip "setuptools>=68" wheel
	$(PYTHON) -m pip download --disable-pip-version-check -q -d $(WHEELHOUSE_DIR) -r requirements-torch.txt $(TORCH_FROM)
	$(PYTHON) -m pip download --disable-pip-version-check -q -d $(WHEELHOUSE_DIR) -c requirements-torch.txt ".[dev]"

# The README's pictures and the teacher's answer key, generated from the code.
figures: $(STAMP)
	$(BIN)/python scripts/make_readme_figures.py

answers: $(STAMP)
	$(BIN)/python scripts/make_answer_key.py

# The three-hour plan as reveal.js decks that work offline (build/slides/index.html), from the stored outputs;
# reveal.js and MathJax come once from the npm registry (npm needed then), into build/slides/assets.
slides: $(STAMP)
	$(BIN)/python scripts/make_slides.py --out build/slides

# The learner's copy: the notebooks and checkers without the solutions in plain text, into $(LEARNER_DIR)/notebooks
# (exN_k.solution() prints no code there). Hand that folder to the learners; notebooks/ stays the teacher's.
LEARNER_DIR ?= learner
learner-copy: $(STAMP)
	$(BIN)/python scripts/learner_copy.py --out $(LEARNER_DIR)

# The scaling table (about an hour on 2 cores; BENCH_ARGS="--threads 1" etc. to tune) and the short run.
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -m lrp_core.tools.bench --json results/bench.json --markdown $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m lrp_core.tools.bench --quick $(BENCH_ARGS)

evaluate: $(STAMP)
	$(BIN)/python -m lrp_core.evaluation --model toy-vit --methods all --n 500 --out results/toy-vit.json

clean:
	rm -rf $(VENV) build *.egg-info site .cache
