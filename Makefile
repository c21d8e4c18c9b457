# Two entry points: `make lab` (install + open the course) and `make test`
# (install + run the whole test suite). Both build the local .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install lab test browser bench bench-quick evaluate clean

$(STAMP): pyproject.toml requirements-torch.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q --upgrade pip
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements-torch.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q -c requirements-torch.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Headless Chromium for the end-to-end widget test (Debian package, no download
# of a browser by a test tool).
browser:
	@command -v chromium >/dev/null 2>&1 || bash scripts/install_chromium.sh

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/00_welcome.ipynb

test: $(STAMP) browser
	$(BIN)/python -m pytest

# The scaling table (about an hour on 2 cores; BENCH_ARGS="--threads 1" etc. to tune) and the short run.
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -m lrp_core.bench --json results/bench.json --markdown $(BENCH_ARGS)

bench-quick: $(STAMP)
	$(BIN)/python -m lrp_core.bench --quick $(BENCH_ARGS)

evaluate: $(STAMP)
	$(BIN)/python -m lrp_core.evaluate --model toy-vit --methods all --n 500 --out results/toy-vit.json

clean:
	rm -rf $(VENV) build *.egg-info
