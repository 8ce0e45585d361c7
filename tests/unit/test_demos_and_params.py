from __future__ import annotations

import numpy as np
import pytest

from ragen_rllib.algorithms.starpo.params import PRESETS, StarPOParams, starpo, starpo_s
from ragen_rllib.envs import make_env
from ragen_rllib.envs.demos import DEMO_THOUGHTS, demo_actions, demo_reply, make_demo_fn
from ragen_rllib.prompting import PromptConfig, execute_reply


@pytest.mark.parametrize("env_name,variant", [("bandit", None), ("sokoban", None), ("sokoban", "larger"),
                                              ("frozen_lake", "not_slippery"), ("countdown", None)])
def test_expert_demonstrations_solve_the_env(env_name: str, variant: str | None) -> None:
    rng = np.random.default_rng(0)
    for seed in range(20):
        env = make_env(env_name, variant=variant, **({"max_actions": 100} if env_name in ("sokoban",) else {}))
        env.reset(seed=seed)
        for _ in range(30):
            reply = "<answer>" + demo_reply(demo_actions(env, "expert", rng, 5), enable_think=False)
            out = execute_reply(env, reply, PromptConfig(enable_think=False))
            assert out.parsed.well_formed and out.penalty == 0.0
            if out.done:
                break
        assert out.success, (env_name, variant, seed)


@pytest.mark.parametrize("env_name", ["bandit", "sokoban", "frozen_lake", "countdown"])
@pytest.mark.parametrize("think", [True, False])
def test_random_valid_demonstrations_are_well_formed_and_valid(env_name: str, think: bool) -> None:
    rng = np.random.default_rng(1)
    cfg = PromptConfig(enable_think=think)
    for seed in range(20):
        env = make_env(env_name)
        env.reset(seed=seed)
        reply = cfg.generation_prefix + demo_reply(demo_actions(env, "random-valid", rng, 5), enable_think=think)
        out = execute_reply(env, reply, cfg)
        assert out.parsed.well_formed and out.num_invalid == 0 and out.num_valid >= 1


def test_think_demonstrations_vary_the_thought_but_not_the_actions() -> None:
    """Think-format demos draw their thought from DEMO_THOUGHTS (spread-out lengths) on a separate
    stream: the answers are those of the no-think demos with the same seed."""
    think, plain = make_demo_fn("random-valid", 7, True, 5), make_demo_fn("random-valid", 7, False, 5)
    thoughts = []
    for seed in range(40):
        env = make_env("sokoban")
        env.reset(seed=seed)
        t, a = think(env), plain(env)
        thought, answer = t.split("</think><answer>")
        assert answer == a and thought in DEMO_THOUGHTS
        thoughts.append(thought)
        out = execute_reply(env, PromptConfig(enable_think=True).generation_prefix + t, PromptConfig(enable_think=True))
        assert out.parsed.well_formed
    assert set(thoughts) == set(DEMO_THOUGHTS)
    lengths = sorted(len(x.split()) for x in DEMO_THOUGHTS)
    assert lengths[0] <= 3 and lengths[-1] >= 12


def test_presets_match_ragen() -> None:
    s, v = starpo_s(), starpo()
    assert (s.rollout_filter_ratio, s.clip_ratio_low, s.clip_ratio_high, s.kl_mode, s.adv_estimator) == \
        (0.25, 0.2, 0.28, "off", "gae")
    assert (v.rollout_filter_ratio, v.rollout_filter_type, v.clip_ratio_high, v.kl_mode, v.kl_coef) == \
        (1.0, "all", 0.2, "loss", 0.001)
    assert set(PRESETS) == {"starpo", "starpo_s"}


@pytest.mark.parametrize("field,value", [("rollout_filter_ratio", 0.0), ("rollout_filter_ratio", 1.5),
                                         ("clip_ratio_low", 1.0), ("adv_estimator", "a2c"), ("gamma", 1.1),
                                         ("env_groups", 0), ("kl_coef", 0.1), ("loss_agg_mode", "sum"),
                                         ("actor_lr", 0.0), ("format_penalty", 0.5), ("high_level_gamma", 2.0),
                                         ("mi_every", -1), ("mi_num_samples", 1), ("mi_num_samples", 2.5),
                                         ("pack_tokens", 0), ("engine_compile", "yes")])
def test_validation_names_field_and_value(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"StarPOParams\.{field} .*{value!r}"):
        StarPOParams().replace(**{field: value})


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(TypeError, match="clip_ratio_hi"):
        StarPOParams().replace(clip_ratio_hi=0.3)


def test_bi_level_gae_needs_the_critic() -> None:
    with pytest.raises(ValueError, match="bi_level_gae"):
        StarPOParams().replace(adv_estimator="grpo", bi_level_gae=True)


def test_training_temperature_must_be_positive_and_sampler_logps_need_t1():
    from ragen_rllib.algorithms.starpo.params import starpo_s

    with pytest.raises(ValueError, match="temperature"):
        starpo_s(model="m", temperature=0.0)
    with pytest.raises(ValueError, match="old_logp_source"):
        starpo_s(model="m", temperature=0.7, old_logp_source="sampler")
    assert starpo_s(model="m", temperature=0.7).temperature == 0.7
    assert starpo_s(model="m", val_temperature=0.0).val_temperature == 0.0  # greedy validation stays allowed


def test_warmup_notes_repeated_expert_demonstrations() -> None:
    from ragen_rllib.algorithms.starpo.experiment import Warmup

    note = Warmup(steps=20, kind="expert", groups=4, group_size=4).duplicate_demos_note()
    assert note is not None and "repeats each demonstration 4 times" in note and "(80 distinct" in note
    assert "warmup.groups=16 warmup.group_size=1" in note
    assert Warmup(steps=20, kind="expert", groups=16, group_size=1).duplicate_demos_note() is None
    assert Warmup(steps=20, kind="random-valid", groups=4, group_size=4).duplicate_demos_note() is None
    assert Warmup(steps=0, kind="expert").duplicate_demos_note() is None
