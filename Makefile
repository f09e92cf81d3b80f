# `make demo` and `make test` each create or refresh .venv and install what they need.
# torch is pinned to 2.13.0, the CPU build pip finds on this machine's disk.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[train,dev]"
	# llm-analysis (an independent cross-check in the tests) pins huggingface-hub<0.15, which would
	# drag transformers back to 4.31; it imports neither unless asked to fetch a config, so no deps.
	$(PY) -m pip install --quiet --no-deps "llm-analysis==0.2.2"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m rpeg train examples/demo-grpo-tiny.yaml

test: $(STAMP)
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

clean:
	rm -rf $(VENV) rpeg-out .pytest_cache .hypothesis
