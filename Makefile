# SpINA. `make demo` and `make test` set everything up on a fresh Debian machine themselves.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench profile clean help

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV) $(PYTHON)
	touch $(STAMP)

setup: $(STAMP)  ## create .venv, install Debian and Python dependencies

demo: $(STAMP)  ## the main job: software switch + 4 workers, sparse all-reduce vs gloo
	$(PY) -m spina.demo $(DEMO_ARGS)

test: $(STAMP)  ## the whole test suite
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)  ## SpINA vs gloo sweep (12 min here): bench/out/{results.csv,summary.md,*.png}
	$(PY) -m bench.allreduce_bench $(BENCH_ARGS)

profile: $(STAMP)  ## cProfile + memory of agent and software switch at the base point: bench/out/profile/
	$(PY) -m bench.profile $(PROFILE_ARGS)

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info
