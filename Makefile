# The two commands a new user needs: `make run` and `make test`. Both set up .venv first
# (idempotent: a no-op taking well under a second once done).
PY := .venv/bin/python
MODEL ?= smollm2-135m-instruct
PYTEST_ARGS ?=

.PHONY: reproduce-baselines reproduce-bandit reproduce-frozen-lake reproduce-echo-trap reproduce-echo-trap-seeds reproduce-echo-trap-seeds-more reproduce-echo-trap-format reproduce-filter-ratio reproduce-frozen-lake-echo-trap reproduce-expert-sft-rl reproduce-frozen-lake-8x8 reproduce-frozen-lake-guided reproduce-frozen-lake-guided-rl reproduce-frozen-lake-rl reproduce-frozen-lake-curriculum reproduce-frozen-lake-sft reproduce-frozen-lake-sft-rl reproduce-frozen-lake-spaced-rl reproduce-frozen-lake-guided-sft reproduce-frozen-lake-guided-sft-rl reproduce-sokoban-sft reproduce-sokoban-sft-rl reproduce-sokoban-sft120-rl reproduce-sokoban-rl reproduce-filter-top-p reproduce-think reproduce-frozen-lake-guided-think setup run rollout prompts test lint test-unit test-all bench bench-learner bench-iteration bench-envs bench-rollout bench-bf16 model clean

# A target that starts from another run's policy stops with one line when that policy is missing:
# $(call need_policy,VARIABLE,command that makes it)
need_policy = test -d $($(1)) || { echo "error: no policy at $(1)=$($(1)); make it with: $(2)" >&2; exit 2; }

setup:
	@bash scripts/setup.sh

model: setup
	@$(PY) -m ragen_rllib.cli models prepare $(MODEL) >/dev/null

# Main job on the embedded default: StarPO-S on the Bandit with SmolLM2-135M-Instruct on the CPU
# vLLM engine (format warm-up, then RL), tracked in MLflow (sqlite under runs/), trajectories in
# Arrow under runs/<run>/trajectories, the trained model exported to runs/<run>/hf_model.
# It trains LoRA adapters (rank 8, alpha 16, LR 1e-4): in 3 seeds the same validation as full
# fine-tuning (1.00 on the train names, 0.91-0.94 held out) at 3.4 GB summed over its processes
# instead of 5.0 GB, and 2.0 min instead of 2.4 (docs/results.md). Full fine-tuning, the `cpu`
# profile as written (what every reproduce-bandit* target runs): make run RUN_LORA=
RUN_CONFIG ?= experiments/bandit_starpo_s.yaml
RUN_PROFILE ?= cpu
RUN_LORA ?= --set starpo.lora_rank=8 --set starpo.lora_alpha=16.0 --set starpo.actor_lr=1e-4
RUN_SET ?=
run: model
	@$(PY) -m ragen_rllib.cli train --config $(RUN_CONFIG) --profile $(RUN_PROFILE) $(RUN_LORA) $(RUN_SET)

# Browse the default MLflow store (runs/mlflow.db). MLflow's UI has no authentication, so it binds
# 127.0.0.1 only; MLFLOW_HOST=0.0.0.0 exposes it to the network (a decision, not a default).
MLFLOW_HOST ?= 127.0.0.1
MLFLOW_PORT ?= 5000
.PHONY: mlflow-ui
mlflow-ui: setup
	@$(PY) -m mlflow ui --backend-store-uri sqlite:///runs/mlflow.db --host $(MLFLOW_HOST) --port $(MLFLOW_PORT)

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
	@$(PY) scripts/frozen_lake_ceiling.py

# The other results of docs/results.md, one target each. tests/integration/test_reproduce_targets.py
# runs every reproduce-* target's ragen-rllib command for one iteration on a tiny model, so none rots.
reproduce-bandit: model
	@$(PY) -m ragen_rllib.cli train --config experiments/bandit_starpo_s.yaml --profile cpu --run-name repro-bandit

# FrozenLake (not slippery), StarPO-S, 40 iterations, validation on 128 fixed states (~9 min).
reproduce-frozen-lake: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" --set starpo.val_groups=128 \
		--set iterations=40 --set starpo.test_freq=20 --set checkpoint_freq=20

# FrozenLake with replies cut at 24 tokens, 60 iterations, seeds 10000 and 10001, then their
# Echo-Trap signals on one plot (~28 min; docs/results.md).
reproduce-frozen-lake-echo-trap: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-24tok-10000 --set starpo.seed=10000 --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" --set starpo.val_groups=128 --set iterations=60 \
		--set starpo.test_freq=20 --set checkpoint_freq=60 --set starpo.response_length=24
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-24tok-10001 --set starpo.seed=10001 --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" --set starpo.val_groups=128 --set iterations=60 \
		--set starpo.test_freq=20 --set checkpoint_freq=60 --set starpo.response_length=24
	@$(PY) scripts/plot_echo_trap_runs.py runs/repro-frozen-lake-24tok-10000 runs/repro-frozen-lake-24tok-10001 \
		--out docs/echo_trap_frozen_lake.png

# FrozenLake (not slippery) at 8 states x 8 samples, 24-token replies, 31 iterations (keeps 2 groups =
# 16 rows, one optimizer step); validation on 128 fixed states before, at 25 and at the end (~32 min
# on a 2-core avx512_bf16 CPU; docs/results.md).
reproduce-frozen-lake-8x8: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-8x8-24tok --set starpo.seed=10000 --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" --set starpo.val_groups=128 --set iterations=31 \
		--set starpo.test_freq=25 --set checkpoint_freq=31 --set starpo.response_length=24 \
		--set starpo.env_groups=8 --set starpo.group_size=8 --set starpo.ppo_mini_batch_size=16

# FrozenLake `guided` (not slippery; each state also says where the goal lies in action words), the
# 24-token setting at 8 states x 4 samples (keeps 2 groups = 8 rows, one optimizer step), 22 iterations;
# validation on 128 fixed states before, at 20 and at the end, then how the policy used the goal line
# (~45 min on a 2-core AVX2 CPU; docs/results.md).
reproduce-frozen-lake-guided: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-guided --set starpo.seed=10000 --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" --set starpo.val_groups=128 --set iterations=22 \
		--set starpo.test_freq=20 --set checkpoint_freq=22 --set starpo.response_length=24 \
		--set starpo.env_groups=8 --set starpo.ppo_mini_batch_size=8
	@$(PY) scripts/guided_hint_following.py runs/repro-frozen-lake-guided

# FrozenLake `guided`, StarPO-S from the format warm-up at actor LR 5e-5 (5x the profile's; the 20-step
# warm-up runs at it too), 8 states x 4 samples (keeps 2 groups = 8 rows, one optimizer step), 24-token
# replies, 80 iterations; validation on 128 fixed states before, every 20 iterations and at the end,
# then how the policy used the goal line and each validation against the first, state by state
# (15-17 min on a 2-core amx_bf16 CPU, vanilla below 34 min; docs/results.md). Another seed:
# make reproduce-frozen-lake-guided-rl GUIDED_RL_SEED=10001 GUIDED_RL_RUN=repro-frozen-lake-guided-rl-s10001
# Vanilla StarPO at the same setting (keeps all 8 groups = 4 optimizer steps, KL 0.001 in the loss, clip 0.2):
# make reproduce-frozen-lake-guided-rl GUIDED_RL_CONFIG=experiments/frozen_lake_starpo.yaml GUIDED_RL_SEED=10001 GUIDED_RL_RUN=<name>
# StarPO-S at vanilla's number of optimizer steps (the 8 kept rows in 4 mini-batches of 2):
# make reproduce-frozen-lake-guided-rl GUIDED_RL_SET="--set starpo.ppo_mini_batch_size=2" GUIDED_RL_SEED=10000 GUIDED_RL_RUN=<name>
GUIDED_RL_CONFIG ?= experiments/frozen_lake_starpo_s.yaml
GUIDED_RL_SEED ?= 10000
GUIDED_RL_RUN ?= repro-frozen-lake-guided-rl
GUIDED_RL_SET ?=
FL_RL_SETTING = --set starpo.val_groups=128 --set iterations=80 --set starpo.test_freq=20 --set checkpoint_freq=80 \
	--set starpo.response_length=24 --set starpo.env_groups=8 --set starpo.ppo_mini_batch_size=8 --set starpo.actor_lr=5.0e-5
reproduce-frozen-lake-guided-rl: model
	@$(PY) -m ragen_rllib.cli train --config $(GUIDED_RL_CONFIG) --profile cpu \
		--run-name $(GUIDED_RL_RUN) --set starpo.seed=$(GUIDED_RL_SEED) --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" $(FL_RL_SETTING) $(GUIDED_RL_SET)
	@$(PY) scripts/guided_hint_following.py runs/$(GUIDED_RL_RUN)
	@$(PY) scripts/paired_validation.py runs/$(GUIDED_RL_RUN)

# FrozenLake (not slippery, RAGEN's text: no goal line) at the setting of reproduce-frozen-lake-guided-rl:
# StarPO-S from the format warm-up at actor LR 5e-5, 8 states x 4 samples, 24-token replies, 80
# iterations, validation on 128 fixed states every 20 iterations, compared state by state with the
# first (~20 min on the same CPU; docs/results.md). Another seed: make reproduce-frozen-lake-rl FL_RL_SEED=10001 FL_RL_RUN=<name>
# Keep-all StarPO-S (the variant that learned fastest on `guided`), 40 iterations:
# make reproduce-frozen-lake-rl FL_RL_SET="--set starpo.rollout_filter_ratio=1.0 --set iterations=40 --set checkpoint_freq=40" FL_RL_RUN=<name>
FL_RL_SEED ?= 10000
FL_RL_RUN ?= repro-frozen-lake-rl
FL_RL_SET ?=
reproduce-frozen-lake-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(FL_RL_RUN) --set starpo.seed=$(FL_RL_SEED) --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" $(FL_RL_SETTING) $(FL_RL_SET)
	@$(PY) scripts/paired_validation.py runs/$(FL_RL_RUN)

# Expert SFT alone on FrozenLake as RAGEN writes it (not slippery): 120 steps of 16 distinct lakes
# (1,920 expert shortest-path demonstrations, warm-up LR 5e-5, 24-token replies), then the validation
# on 128 fixed states and the export (iterations=0: no RL; ~15 min; docs/results.md). Another seed:
# make reproduce-frozen-lake-sft FL_SFT_SEED=10001 FL_SFT_RUN=<name>. On the spaced
# lake: make reproduce-frozen-lake-sft FL_SFT_ENV=frozen_lake:spaced FL_SFT_RUN=repro-frozen-lake-spaced-sft120
FL_SFT_ENV ?= frozen_lake:not_slippery
FL_SFT_RUN ?= repro-frozen-lake-sft120
FL_SFT_SEED ?= 10000
reproduce-frozen-lake-sft: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(FL_SFT_RUN) --set starpo.seed=$(FL_SFT_SEED) --set starpo.env=$(FL_SFT_ENV) \
		--set "starpo.val_envs=['$(FL_SFT_ENV)']" --set starpo.val_groups=128 --set iterations=0 \
		--set warmup.kind=expert --set warmup.steps=120 --set warmup.groups=16 --set warmup.group_size=1 \
		--set warmup.lr=5.0e-5 --set starpo.response_length=24
	@$(PY) scripts/first_move.py runs/$(FL_SFT_RUN)

# Expert SFT + StarPO-S on the plain lake: StarPO-S from the policy reproduce-frozen-lake-sft wrote (no
# warm-up), at the SFT + RL setting of the `guided` and Sokoban runs: LR 1e-5, 8 lakes x 8 samples (the
# filter keeps 2 groups = 16 rows, one optimizer step), 24-token replies, 24 iterations; validation on 128
# fixed states before RL (= SFT alone) and every 8 iterations, compared state by state (docs/results.md).
# Needs that policy first: make reproduce-frozen-lake-sft. Another seed: make reproduce-frozen-lake-sft
# FL_SFT_SEED=10001 FL_SFT_RUN=<sft> && make reproduce-frozen-lake-sft-rl FL_SFT_RUN=<sft> FL_SFT_RL_SEED=10001
# FL_SFT_RL_RUN=<name>. RL at LR 5e-5: FL_SFT_RL_SET="--set starpo.actor_lr=5.0e-5". RL on RAGEN's slippery
# lake from the same (not-slippery) SFT policy: FL_SFT_RL_ENV=frozen_lake
FL_SFT_RL_FROM ?= runs/$(FL_SFT_RUN)/hf_model
FL_SFT_RL_SEED ?= 10000
FL_SFT_RL_RUN ?= repro-frozen-lake-sft-rl
FL_SFT_RL_SET ?=
FL_SFT_RL_ENV ?= frozen_lake:not_slippery
reproduce-frozen-lake-sft-rl: model
	@$(call need_policy,FL_SFT_RL_FROM,make reproduce-frozen-lake-sft)
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(FL_SFT_RL_RUN) --set starpo.seed=$(FL_SFT_RL_SEED) --set starpo.env=$(FL_SFT_RL_ENV) \
		--set "starpo.val_envs=['$(FL_SFT_RL_ENV)']" --set starpo.val_groups=128 --set iterations=24 \
		--set starpo.test_freq=8 --set checkpoint_freq=24 --set warmup.steps=0 --set starpo.model=$(FL_SFT_RL_FROM) \
		--set starpo.actor_lr=1.0e-5 --set starpo.response_length=24 \
		--set starpo.env_groups=8 --set starpo.group_size=8 --set starpo.ppo_mini_batch_size=16 $(FL_SFT_RL_SET)
	@$(PY) scripts/paired_validation.py runs/$(FL_SFT_RL_RUN)
	@$(PY) scripts/first_move.py runs/$(FL_SFT_RL_RUN)
	@$(PY) scripts/reply_actions.py runs/$(FL_SFT_RL_RUN)

# FrozenLake `spaced` (not slippery; RAGEN's grid with its cells joined by spaces, so each cell is one
# token; not in RAGEN) at the same setting: StarPO-S from the format warm-up at actor LR 5e-5, 8 states
# x 4 samples, 24-token replies, 80 iterations, validation on 128 fixed states (the not-slippery lakes)
# every 20 iterations (docs/results.md). Another seed: make reproduce-frozen-lake-spaced-rl SPACED_SEED=10001 SPACED_RUN=<name>
SPACED_SEED ?= 10000
SPACED_RUN ?= repro-frozen-lake-spaced-rl
reproduce-frozen-lake-spaced-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(SPACED_RUN) --set starpo.seed=$(SPACED_SEED) --set starpo.env=frozen_lake:spaced \
		--set "starpo.val_envs=['frozen_lake:spaced']" $(FL_RL_SETTING)
	@$(PY) scripts/paired_validation.py runs/$(SPACED_RUN)
	@$(PY) scripts/first_move.py runs/$(SPACED_RUN)

# Curriculum: the plain lake above, starting from a `guided` StarPO-S policy instead of the format
# warm-up (no warm-up; 60 iterations; ~11 min). Needs that policy first:
#   make reproduce-frozen-lake-guided-rl GUIDED_RL_SEED=10001 GUIDED_RL_RUN=repro-frozen-lake-guided-rl-s10001
CURRICULUM_FROM ?= runs/repro-frozen-lake-guided-rl-s10001/hf_model
CURRICULUM_SEED ?= 10000
CURRICULUM_RUN ?= repro-frozen-lake-curriculum
reproduce-frozen-lake-curriculum: model
	@$(call need_policy,CURRICULUM_FROM,make reproduce-frozen-lake-guided-rl GUIDED_RL_SEED=10001 GUIDED_RL_RUN=repro-frozen-lake-guided-rl-s10001)
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(CURRICULUM_RUN) --set starpo.seed=$(CURRICULUM_SEED) --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" $(FL_RL_SETTING) \
		--set iterations=60 --set checkpoint_freq=60 --set warmup.steps=0 --set starpo.model=$(CURRICULUM_FROM)
	@$(PY) scripts/paired_validation.py runs/$(CURRICULUM_RUN)

# Expert SFT alone on FrozenLake `guided`: the 20-step warm-up as in reproduce-expert-sft-rl (4 lakes x 4
# copies a step, LR 1e-5), then 40 steps of 8 distinct lakes at LR 5e-5. The validation on 128 fixed
# states before the one RL iteration is SFT alone; that iteration's rollouts (sampled before its update)
# show how often the SFT policy's first action follows the goal line (docs/results.md).
reproduce-frozen-lake-guided-sft: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-guided-sft20 --set starpo.seed=10000 --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" --set starpo.val_groups=128 --set iterations=1 \
		--set warmup.kind=expert --set starpo.response_length=24 \
		--set starpo.env_groups=8 --set starpo.ppo_mini_batch_size=8
	@$(PY) scripts/guided_hint_following.py runs/repro-frozen-lake-guided-sft20
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-guided-sft40 --set starpo.seed=10000 --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" --set starpo.val_groups=128 --set iterations=1 --set checkpoint_freq=1 \
		--set warmup.kind=expert --set warmup.steps=40 --set warmup.groups=8 --set warmup.group_size=1 \
		--set starpo.actor_lr=5.0e-5 --set starpo.response_length=24
	@$(PY) scripts/guided_hint_following.py runs/repro-frozen-lake-guided-sft40

# Expert SFT + StarPO-S vs expert SFT alone on FrozenLake `guided`: the 40-step SFT above (8 distinct
# lakes a step, warm-up LR 5e-5), then 16 RL iterations at LR 1e-5 on 8 lakes x 8 samples (the filter
# keeps 2 groups = 16 rows, one optimizer step). Validation on 128 fixed states before RL (= SFT alone),
# at iteration 8 and at the end, each compared state by state with SFT alone (docs/results.md). Another
# seed: make reproduce-frozen-lake-guided-sft-rl GUIDED_SEED=10001 GUIDED_RUN=repro-frozen-lake-guided-sft-rl-s10001
GUIDED_SEED ?= 10000
GUIDED_RUN ?= repro-frozen-lake-guided-sft-rl
reproduce-frozen-lake-guided-sft-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(GUIDED_RUN) --set starpo.seed=$(GUIDED_SEED) --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" --set starpo.val_groups=128 --set iterations=16 \
		--set starpo.test_freq=8 --set checkpoint_freq=16 \
		--set warmup.kind=expert --set warmup.steps=40 --set warmup.groups=8 --set warmup.group_size=1 \
		--set warmup.lr=5.0e-5 --set starpo.actor_lr=1.0e-5 --set starpo.response_length=24 \
		--set starpo.env_groups=8 --set starpo.group_size=8 --set starpo.ppo_mini_batch_size=16
	@$(PY) scripts/guided_hint_following.py runs/$(GUIDED_RUN)
	@$(PY) scripts/paired_validation.py runs/$(GUIDED_RUN)

# Sokoban 6x6 RL from the format-only warm-up, at the setting of reproduce-frozen-lake-guided-rl:
# StarPO-S at actor LR 5e-5, 8 puzzles x 4 samples, 24-token replies, 80 iterations; validation on
# 128 fixed states of `sokoban`, `sokoban:new_vocab` and `sokoban:larger` every 20 iterations,
# compared state by state with the first (docs/results.md). Another seed:
# make reproduce-sokoban-rl SOKOBAN_RL_SEED=10001 SOKOBAN_RL_RUN=<name>
SOKOBAN_RL_SEED ?= 10000
SOKOBAN_RL_RUN ?= repro-sokoban-rl
SOKOBAN_RL_SET ?=
reproduce-sokoban-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/sokoban_starpo_s.yaml --profile cpu \
		--run-name $(SOKOBAN_RL_RUN) --set starpo.seed=$(SOKOBAN_RL_SEED) \
		--set "starpo.val_envs=['sokoban','sokoban:new_vocab','sokoban:larger']" $(FL_RL_SETTING) $(SOKOBAN_RL_SET)
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RL_RUN) --env sokoban
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RL_RUN) --env sokoban:new_vocab
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RL_RUN) --env sokoban:larger
	@$(PY) scripts/first_move.py runs/$(SOKOBAN_RL_RUN)
	@$(PY) scripts/episode_lengths.py runs/$(SOKOBAN_RL_RUN)

# Expert SFT alone on Sokoban 6x6 at the plain-lake SFT's scale: 120 steps of 16 distinct puzzles (1,920
# BFS plans, <= 5 actions a turn, warm-up LR 5e-5), then validation on 128 fixed states of `sokoban`,
# `sokoban:new_vocab` and `sokoban:larger` and the export (iterations=0: no RL; ~25 min; docs/results.md).
# Another seed: make reproduce-sokoban-sft SOKOBAN_SFT_SEED=10001 SOKOBAN_SFT_RUN=<name>; more plans:
# SOKOBAN_SFT_STEPS=240 (3,840 plans, ~50 min)
SOKOBAN_SFT_SEED ?= 10000
SOKOBAN_SFT_STEPS ?= 120
SOKOBAN_SFT_RUN ?= repro-sokoban-sft120
reproduce-sokoban-sft: model
	@$(PY) -m ragen_rllib.cli train --config experiments/sokoban_starpo_s.yaml --profile cpu \
		--run-name $(SOKOBAN_SFT_RUN) --set starpo.seed=$(SOKOBAN_SFT_SEED) \
		--set "starpo.val_envs=['sokoban','sokoban:new_vocab','sokoban:larger']" --set starpo.val_groups=128 \
		--set iterations=0 --set warmup.kind=expert --set warmup.steps=$(SOKOBAN_SFT_STEPS) --set warmup.groups=16 \
		--set warmup.group_size=1 --set warmup.lr=5.0e-5
	@$(PY) scripts/first_move.py runs/$(SOKOBAN_SFT_RUN)

# Expert SFT + StarPO-S on Sokoban from the 1,920-plan SFT policy above (no warm-up): LR 1e-5, 8 puzzles x
# 8 samples (the filter keeps 2 groups = 16 rows, one optimizer step), 24 iterations; validation on the
# three variants before RL (= SFT alone) and every 12 iterations, compared state by state (~10 min;
# docs/results.md). Needs that policy first: make reproduce-sokoban-sft. GRPO instead of the critic:
# SOKOBAN_SFT_RL_SET="--set starpo.adv_estimator=grpo"
SOKOBAN_SFT_RL_FROM ?= runs/$(SOKOBAN_SFT_RUN)/hf_model
SOKOBAN_SFT_RL_SEED ?= 10000
SOKOBAN_SFT_RL_RUN ?= repro-sokoban-sft120-rl
SOKOBAN_SFT_RL_SET ?=
reproduce-sokoban-sft120-rl: model
	@$(call need_policy,SOKOBAN_SFT_RL_FROM,make reproduce-sokoban-sft)
	@$(PY) -m ragen_rllib.cli train --config experiments/sokoban_starpo_s.yaml --profile cpu \
		--run-name $(SOKOBAN_SFT_RL_RUN) --set starpo.seed=$(SOKOBAN_SFT_RL_SEED) \
		--set "starpo.val_envs=['sokoban','sokoban:new_vocab','sokoban:larger']" --set starpo.val_groups=128 \
		--set iterations=24 --set starpo.test_freq=12 --set checkpoint_freq=24 \
		--set warmup.steps=0 --set starpo.model=$(SOKOBAN_SFT_RL_FROM) --set starpo.actor_lr=1.0e-5 \
		--set starpo.env_groups=8 --set starpo.group_size=8 --set starpo.ppo_mini_batch_size=16 $(SOKOBAN_SFT_RL_SET)
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_SFT_RL_RUN) --env sokoban
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_SFT_RL_RUN) --env sokoban:new_vocab
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_SFT_RL_RUN) --env sokoban:larger
	@$(PY) scripts/first_move.py runs/$(SOKOBAN_SFT_RL_RUN)

# Expert SFT alone vs expert SFT + StarPO-S on Sokoban 6x6 (the paper's SFT comparison; RL from the format
# warm-up did not fit a session here): 40 SFT steps on 8 distinct puzzles a step (BFS plans, <= 5
# actions a turn, warm-up LR 5e-5), then 16 RL iterations at LR 1e-5 on 8 puzzles x 8 samples (the
# filter keeps 2 groups = 16 rows, one optimizer step). Validation on 128 fixed states of `sokoban`,
# `sokoban:new_vocab` and `sokoban:larger` before RL (= SFT alone) and at the end, compared state by
# state, and whether the first move starts a shortest solution (docs/results.md). Another seed: make reproduce-sokoban-sft-rl SOKOBAN_SEED=10001 SOKOBAN_RUN=<name>
SOKOBAN_SEED ?= 10000
SOKOBAN_RUN ?= repro-sokoban-sft-rl
reproduce-sokoban-sft-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/sokoban_starpo_s.yaml --profile cpu \
		--run-name $(SOKOBAN_RUN) --set starpo.seed=$(SOKOBAN_SEED) \
		--set "starpo.val_envs=['sokoban','sokoban:new_vocab','sokoban:larger']" --set starpo.val_groups=128 \
		--set iterations=16 --set starpo.test_freq=16 --set checkpoint_freq=16 \
		--set warmup.kind=expert --set warmup.steps=40 --set warmup.groups=8 --set warmup.group_size=1 \
		--set warmup.lr=5.0e-5 --set starpo.actor_lr=1.0e-5 \
		--set starpo.env_groups=8 --set starpo.group_size=8 --set starpo.ppo_mini_batch_size=16
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RUN) --env sokoban
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RUN) --env sokoban:new_vocab
	@$(PY) scripts/paired_validation.py runs/$(SOKOBAN_RUN) --env sokoban:larger
	@$(PY) scripts/first_move.py runs/$(SOKOBAN_RUN)

# Expert SFT alone vs expert SFT + RL (the paper's SFT comparison) on FrozenLake (not slippery):
# 20 supervised steps on expert shortest paths, then StarPO-S on 8 states x 4 samples (keeps 2 groups
# = 8 rows, one optimizer step) for 24 iterations; validation on 128 fixed states before RL (= SFT
# alone), at iteration 20 and at the end (~35 min on a 2-core AVX2 CPU; docs/results.md).
reproduce-expert-sft-rl: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name repro-frozen-lake-expert-sft-rl --set starpo.seed=10000 --set starpo.env=frozen_lake:not_slippery \
		--set "starpo.val_envs=['frozen_lake:not_slippery']" --set starpo.val_groups=128 --set iterations=24 \
		--set starpo.test_freq=20 --set checkpoint_freq=24 --set warmup.kind=expert \
		--set starpo.env_groups=8 --set starpo.ppo_mini_batch_size=8

# The Echo Trap on the Bandit: vanilla StarPO vs StarPO-S, 3 seeds each (~21 min).
reproduce-echo-trap: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/echo_trap_bandit.yaml

# The same sweep in ten more seeds (10003-10012; ~60 min): fall counts over 13 seeds per preset.
reproduce-echo-trap-seeds: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/echo_trap_bandit_seeds.yaml

# Ten further seeds (10013-10022; ~70 min): fall counts over 23 seeds per preset.
reproduce-echo-trap-seeds-more: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/echo_trap_bandit_seeds_more.yaml

# The same sweep in twenty new seeds (10023-10042), for the format-collapse prediction (docs/results.md).
reproduce-echo-trap-format: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/echo_trap_bandit_format.yaml

# Filter-ratio ablation on the Bandit: keep 25 / 50 / 100 % of groups, 3 seeds each.
reproduce-filter-ratio: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/filter_ratio_bandit.yaml

# RAGEN-2's top-p reward-std filter in the same ablation: linear and softmax modes, p = 0.9, zero-std
# groups excluded, 3 seeds each (docs/results.md).
reproduce-filter-top-p: model
	@$(PY) -m ragen_rllib.cli sweep --config experiments/sweeps/filter_top_p_bandit.yaml

# The think format on a multi-turn env: reproduce-frozen-lake-guided-rl's setting (StarPO-S, 80
# iterations, actor LR 5e-5) with <think>...</think><answer>...</answer> replies of up to 48 tokens and
# a warm-up on think-format demonstrations; think length per iteration is rollout/think_words_mean.
# ~27 min on the 2-core box (docs/results.md).
GUIDED_THINK_SEED ?= 10000
GUIDED_THINK_RUN ?= repro-frozen-lake-guided-think
reproduce-frozen-lake-guided-think: model
	@$(PY) -m ragen_rllib.cli train --config experiments/frozen_lake_starpo_s.yaml --profile cpu \
		--run-name $(GUIDED_THINK_RUN) --set starpo.seed=$(GUIDED_THINK_SEED) --set starpo.env=frozen_lake:guided \
		--set "starpo.val_envs=['frozen_lake:guided']" $(FL_RL_SETTING) \
		--set starpo.enable_think=true --set starpo.response_length=48

# The think format: the Bandit CPU profile with <think>...</think><answer>...</answer> replies (warm-up
# on think-format demonstrations with neutral thoughts of 3-17 words), 48 tokens a reply; the think
# length is logged as rollout/think_words_mean (docs/results.md). ~4 min on the 2-core box. Other seeds:
#   make reproduce-think THINK_SEED=10001 THINK_RUN=repro-bandit-think-s10001
THINK_SEED ?= 10000
THINK_RUN ?= repro-bandit-think
reproduce-think: model
	@$(PY) -m ragen_rllib.cli train --config experiments/bandit_starpo_s.yaml --profile cpu \
		--run-name $(THINK_RUN) --set starpo.seed=$(THINK_SEED) --set starpo.enable_think=true \
		--set starpo.response_length=48

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

# bf16 vs fp32 on this CPU, learner and vLLM engine (~7 min on a CPU that emulates bf16): what `auto` decides and why.
bench-bf16: model
	@$(PY) benchmarks/bf16_cpu.py

clean:
	rm -rf .venv build *.egg-info
