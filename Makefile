# The two commands a new user needs: `make run` and `make test`. Both set up .venv first
# (idempotent: a no-op taking well under a second once done).
PY := .venv/bin/python
MODEL ?= smollm2-135m-instruct
PYTEST_ARGS ?=

.PHONY: setup run test test-unit test-all bench-envs model clean

setup:
	@bash scripts/setup.sh

model: setup
	@$(PY) -m ragen_rllib.cli models prepare $(MODEL) >/dev/null

# Main job on the embedded default. Until the rollout issue lands: prepare the embedded
# model and show one rendered prompt per env (think and no-think formats).
run: model
	@$(PY) -m ragen_rllib.cli envs
	@$(PY) -m ragen_rllib.cli prompt all --model $(MODEL) --both-formats

# Default tiers: unit + integration + vllm (CPU). gpu and learning tiers are opt-in.
test: model
	@$(PY) -m pytest -m "not gpu and not learning" $(PYTEST_ARGS)

test-unit: setup
	@$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-all: model
	@$(PY) -m pytest $(PYTEST_ARGS)

bench-envs: setup
	@$(PY) benchmarks/envs.py

clean:
	rm -rf .venv build *.egg-info
