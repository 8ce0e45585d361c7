"""The one trajectory schema: column names, the pyarrow schema, and its version.

One row per trajectory (one multi-turn episode of one sample of one initial-state group).
Every module reads and writes trajectory data through these constants; no column string literal
appears anywhere else.

Symbols: B trajectories, L tokens of one trajectory (prompt + observation + sampled tokens,
token-exact: the ids the engine saw and sampled, never re-tokenised text), K turns.
Units: log-probs in nats; rewards unitless per turn/episode; lengths in tokens.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "2"
#: Key of the schema version in the Arrow/Parquet schema metadata.
SCHEMA_VERSION_KEY = b"ragen_rllib.trajectory_schema_version"
#: Versions whose files the store still reads. Version 1 lacks ``token_advantages`` only (a
#: nullable column added in version 2); its files read with that column null.
READABLE_VERSIONS = ("1", SCHEMA_VERSION)


class Col:
    """Every trajectory column name."""

    # --- provenance
    RUN_ID = "run_id"  # string: the run that produced the row
    ITERATION = "iteration"  # int32: training iteration (rollout batch index)
    POLICY_VERSION = "policy_version"  # int64: version of the weights that sampled every token of the row
    ENV_NAME = "env_name"  # string: registry name, e.g. "sokoban"
    ENV_VARIANT = "env_variant"  # string: variant, e.g. "simple"
    GROUP_ID = "group_id"  # int64: initial-state group; the N samples of a group share it
    SAMPLE_IDX = "sample_idx"  # int32: index of the sample inside its group, 0..N-1
    INITIAL_SEED = "initial_seed"  # int64: initial-state seed (shared inside a group)
    DYNAMICS_SEED = "dynamics_seed"  # int64: dynamics seed (per sample)
    # --- tokens, aligned, length L
    TOKEN_IDS = "token_ids"  # list<int32> (L,): the full token-exact sequence
    LOSS_MASK = "loss_mask"  # list<uint8> (L,): 1 exactly on sampled tokens
    SAMPLE_LOGPROBS = "sample_logprobs"  # list<float32> (L,): sampler log-prob of each sampled token, 0 elsewhere
    TOKEN_TURN = "token_turn"  # list<int16> (L,): turn index (0..K-1) of each token; prompt tokens of turn k carry k
    # --- per turn, length K
    TURN_REWARDS = "turn_rewards"  # list<float32> (K,): env reward + format penalty of each turn
    TURN_ENV_REWARDS = "turn_env_rewards"  # list<float32> (K,): raw env reward of each turn
    TURN_PENALTIES = "turn_penalties"  # list<float32> (K,): format penalty of each turn (0 or negative)
    TURN_WELL_FORMED = "turn_well_formed"  # list<bool> (K,)
    TURN_STATES = "turn_states"  # list<string> (K,): observation shown at the start of each turn
    TURN_RESPONSES = "turn_responses"  # list<string> (K,): decoded sampled reply (forced prefix included)
    TURN_FINISH = "turn_finish"  # list<string> (K,): engine finish reason ("stop" | "length")
    FINAL_STATE = "final_state"  # string: observation after the last turn
    # --- episode summary
    EPISODE_RETURN = "episode_return"  # float64: sum of raw env rewards (what the StarPO-S filter reads)
    SCORE = "score"  # float64: episode_return + sum of penalties (what the reward placement uses)
    SUCCESS = "success"  # bool
    TERMINATED = "terminated"  # bool: ended in the env (goal, hole, solved, answered)
    TRUNCATED = "truncated"  # bool: action budget or max turns ran out
    NUM_TURNS = "num_turns"  # int16: K
    NUM_VALID_ACTIONS = "num_valid_actions"  # int32
    NUM_INVALID_ACTIONS = "num_invalid_actions"  # int32
    NUM_DROPPED_ACTIONS = "num_dropped_actions"  # int32: beyond max_actions_per_turn, never executed
    NUM_EFFECTIVE_ACTIONS = "num_effective_actions"  # int32
    NUM_SAMPLED_TOKENS = "num_sampled_tokens"  # int32: sum of loss_mask
    CONTEXT_TRUNCATED = "context_truncated"  # bool: the context budget dropped turns or stopped the episode
    DROPPED_CONTEXT_TURNS = "dropped_context_turns"  # int32: most turns dropped from any prompt of the episode
    # --- added by the learner (null until then)
    KEPT = "kept"  # bool, nullable: the StarPO-S filter kept this row's group
    # list<float32> (L,), nullable: the advantage of each token as the update used it (unitless;
    # whitened for GAE), 0 where loss_mask is 0; null for rows the update did not train on
    # (a filtered-out group) and until the update has run. Not in TOKEN_ALIGNED: it may be null.
    TOKEN_ADVANTAGES = "token_advantages"


SCHEMA: pa.Schema = pa.schema(
    [
        pa.field(Col.RUN_ID, pa.string(), nullable=False),
        pa.field(Col.ITERATION, pa.int32(), nullable=False),
        pa.field(Col.POLICY_VERSION, pa.int64(), nullable=False),
        pa.field(Col.ENV_NAME, pa.string(), nullable=False),
        pa.field(Col.ENV_VARIANT, pa.string(), nullable=False),
        pa.field(Col.GROUP_ID, pa.int64(), nullable=False),
        pa.field(Col.SAMPLE_IDX, pa.int32(), nullable=False),
        pa.field(Col.INITIAL_SEED, pa.int64(), nullable=False),
        pa.field(Col.DYNAMICS_SEED, pa.int64(), nullable=False),
        pa.field(Col.TOKEN_IDS, pa.list_(pa.int32()), nullable=False),
        pa.field(Col.LOSS_MASK, pa.list_(pa.uint8()), nullable=False),
        pa.field(Col.SAMPLE_LOGPROBS, pa.list_(pa.float32()), nullable=False),
        pa.field(Col.TOKEN_TURN, pa.list_(pa.int16()), nullable=False),
        pa.field(Col.TURN_REWARDS, pa.list_(pa.float32()), nullable=False),
        pa.field(Col.TURN_ENV_REWARDS, pa.list_(pa.float32()), nullable=False),
        pa.field(Col.TURN_PENALTIES, pa.list_(pa.float32()), nullable=False),
        pa.field(Col.TURN_WELL_FORMED, pa.list_(pa.bool_()), nullable=False),
        pa.field(Col.TURN_STATES, pa.list_(pa.string()), nullable=False),
        pa.field(Col.TURN_RESPONSES, pa.list_(pa.string()), nullable=False),
        pa.field(Col.TURN_FINISH, pa.list_(pa.string()), nullable=False),
        pa.field(Col.FINAL_STATE, pa.string(), nullable=False),
        pa.field(Col.EPISODE_RETURN, pa.float64(), nullable=False),
        pa.field(Col.SCORE, pa.float64(), nullable=False),
        pa.field(Col.SUCCESS, pa.bool_(), nullable=False),
        pa.field(Col.TERMINATED, pa.bool_(), nullable=False),
        pa.field(Col.TRUNCATED, pa.bool_(), nullable=False),
        pa.field(Col.NUM_TURNS, pa.int16(), nullable=False),
        pa.field(Col.NUM_VALID_ACTIONS, pa.int32(), nullable=False),
        pa.field(Col.NUM_INVALID_ACTIONS, pa.int32(), nullable=False),
        pa.field(Col.NUM_DROPPED_ACTIONS, pa.int32(), nullable=False),
        pa.field(Col.NUM_EFFECTIVE_ACTIONS, pa.int32(), nullable=False),
        pa.field(Col.NUM_SAMPLED_TOKENS, pa.int32(), nullable=False),
        pa.field(Col.CONTEXT_TRUNCATED, pa.bool_(), nullable=False),
        pa.field(Col.DROPPED_CONTEXT_TURNS, pa.int32(), nullable=False),
        pa.field(Col.KEPT, pa.bool_(), nullable=True),
        pa.field(Col.TOKEN_ADVANTAGES, pa.list_(pa.float32()), nullable=True),
    ],
    metadata={SCHEMA_VERSION_KEY: SCHEMA_VERSION.encode()},
)

#: Columns aligned token by token (same length L within a row).
TOKEN_ALIGNED = (Col.TOKEN_IDS, Col.LOSS_MASK, Col.SAMPLE_LOGPROBS, Col.TOKEN_TURN)
#: Columns aligned turn by turn (same length K == num_turns within a row).
TURN_ALIGNED = (Col.TURN_REWARDS, Col.TURN_ENV_REWARDS, Col.TURN_PENALTIES, Col.TURN_WELL_FORMED, Col.TURN_STATES,
                Col.TURN_RESPONSES, Col.TURN_FINISH)
