# The two commands a new user needs: `make run` and `make test`. Both set up .venv first
# (idempotent: a no-op taking well under a second once done).
PY := .venv/bin/python
MODEL ?= smollm2-135m-instruct
PYTEST_ARGS ?=

.PHONY: reproduce-baselines setup run rollout prompts test lint test-unit test-all bench bench-learner bench-iteration bench-envs bench-rollout model clean

setup:
	@bash scripts/setup.sh

model: setup
	@$(PY) -m ragen_rllib.cli models prepare $(MODEL) >/dev/null

# Main job on the embedded default: StarPO-S on the Bandit with SmolLM2-135M-Instruct on the CPU
# vLLM engine (format warm-up, then RL), tracked in MLflow (sqlite under runs/), trajectories in
# Arrow under runs/<run>/trajectories, the trained model exported to runs/<run>/hf_model.
RUN_CONFIG ?= experiments/bandit_starpo_s.yaml
RUN_PROFILE ?= cpu
RUN_SET ?=
run: model
	@$(PY) -m ragen_rllib.cli train --config $(RUN_CONFIG) --profile $(RUN_PROFILE) $(RUN_SET)

# The rollout-only job (no training): every env, summary table, Parquet under runs/.
ENGINE ?= vllm
ROLLOUT_ARGS ?= --groups 2 --group-size 4 --max-new-tokens 96
rollout: model
	@$(PY) -m ragen_rllib.cli rollout --env bandit,sokoban,frozen_lake,countdown --model $(MODEL) \
		--engine $(ENGINE) $(ROLLOUT_ARGS) --out runs

prompts: model
	@$(PY) -m ragen_rllib.cli prompt all --model $(MODEL) --both-formats

# Baselines on 128 fixed validation states per env (random valid actions, the untrained model,
# the expert) for FrozenLake and Sokoban: docs/results.md. ~5 min on the 2-core CPU box.
reproduce-baselines: model
	@$(PY) scripts/baselines.py

bench-rollout: model
	@$(PY) benchmarks/rollout.py

# Speed: the learner update vs bare torch (shared vs unshared prefixes), then per-stage iteration
# times and scaling in trajectories and turns (~20 min on the 2-core CPU box). Ratios come from
# baselines measured in the same run.
bench: bench-learner bench-iteration

bench-learner: model
	@$(PY) benchmarks/learner.py

bench-iteration: model
	@$(PY) benchmarks/iteration.py --json runs/bench_iteration.json

# Default tiers: unit + integration + vllm (CPU) + learning (tiny model). gpu is opt-in.
test: model lint
	@$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

lint: setup
	@$(PY) -m ruff check .

test-unit: setup
	@$(PY) -m pytest -m unit $(PYTEST_ARGS)

test-all: model
	@$(PY) -m pytest $(PYTEST_ARGS)

bench-envs: setup
	@$(PY) benchmarks/envs.py

clean:
	rm -rf .venv build *.egg-info
