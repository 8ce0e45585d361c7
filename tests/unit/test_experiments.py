"""experiments/*.yaml: every file and profile loads, validates, and means what its name says.

Only yaml + StarPOParams (+ the numpy-only env registry) are used: no ray, no torch, no model.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragen_rllib.algorithms.starpo.params import StarPOParams
from ragen_rllib.algorithms.starpo.train import build_params, load_experiment
from ragen_rllib.envs import env_class
from ragen_rllib.envs.demos import DEMO_KINDS

ROOT = Path(__file__).resolve().parents[2]
EXP_DIR = ROOT / "experiments"
ENVS = ("bandit", "sokoban", "frozen_lake", "countdown")
PRESETS = ("starpo", "starpo_s")
EXPECTED_FILES = sorted(f"{env}_{preset}.yaml" for env in ENVS for preset in PRESETS)
FILES = sorted(EXP_DIR.glob("*.yaml"))
FIELDS = {f.name: f for f in dataclasses.fields(StarPOParams)}
MULTI_TURN = ("sokoban", "frozen_lake")
HELD_OUT = {
    "bandit": ("bandit", "bandit:test"),
    "sokoban": ("sokoban", "sokoban:larger", "sokoban:new_vocab", "frozen_lake"),
    "frozen_lake": ("frozen_lake",),
    "countdown": ("countdown",),
}


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _profiles(path: Path) -> list[str | None]:
    return [None, *sorted(_raw(path).get("profiles") or {})]


def _name_parts(path: Path) -> tuple[str, str]:
    """``sokoban_starpo_s.yaml`` -> ("sokoban", "starpo_s"); ``frozen_lake_starpo`` -> ("frozen_lake", "starpo")."""
    stem = path.stem
    preset = "starpo_s" if stem.endswith("_starpo_s") else "starpo"
    return stem[: -len(preset) - 1], preset


CASES = [pytest.param(f, prof, id=f"{f.stem}[{prof or 'default'}]") for f in FILES for prof in _profiles(f)]


def test_the_eight_files_exist() -> None:
    assert [f.name for f in FILES] == EXPECTED_FILES


@pytest.mark.parametrize("path,profile", CASES)
def test_every_file_and_profile_builds_validated_params(path: Path, profile: str | None) -> None:
    env, preset = _name_parts(path)
    cfg = load_experiment(path, profile)
    assert cfg["preset"] == preset
    assert cfg["profile"] == profile
    p = build_params(cfg)
    assert p.validate() is p
    assert p.env.split(":")[0] == env
    assert int(cfg["iterations"]) >= 1
    assert cfg["tracking"]["experiment"] == f"ragen-{env}"
    assert set(cfg["rllib"]) <= {"num_env_runners", "num_learners", "num_cpus_per_env_runner", "ray_num_cpus",
                                 "num_gpus_per_learner"}
    if preset == "starpo_s":
        assert (p.rollout_filter_ratio, p.rollout_filter_type) == (0.25, "std")
        assert (p.clip_ratio_low, p.clip_ratio_high) == (0.2, 0.28)
        assert (p.kl_mode, p.kl_coef) == ("off", 0.0)
    else:
        assert (p.rollout_filter_ratio, p.rollout_filter_type) == (1.0, "all")
        assert p.clip_ratio_low == p.clip_ratio_high == 0.2
        assert p.kl_mode != "off" and p.kl_coef > 0
    assert p.use_critic  # both presets: PPO/GAE with a critic


@pytest.mark.parametrize("path", FILES, ids=lambda f: f.stem)
def test_starpo_sections_use_only_params_fields_with_the_right_types(path: Path) -> None:
    raw = _raw(path)
    sections = {"default": raw.get("starpo") or {}}
    sections.update({name: prof.get("starpo") or {} for name, prof in (raw.get("profiles") or {}).items()})
    for where, section in sections.items():
        unknown = sorted(set(section) - set(FIELDS))
        assert not unknown, f"{path.name} [{where}]: not StarPOParams fields: {unknown}"
        for key, value in section.items():
            default = FIELDS[key].default
            if key == "bf16_autocast":
                assert value in (True, False, "auto"), f"{path.name} [{where}] {key}={value!r}: want a bool or auto"
            elif isinstance(default, bool):
                assert isinstance(value, bool), f"{path.name} [{where}] {key}={value!r}: want a bool"
            elif isinstance(default, float):  # YAML reads 1e-6 (no dot) as a string
                assert isinstance(value, (int, float)) and not isinstance(value, bool), \
                    f"{path.name} [{where}] {key}={value!r}: want a number (write 1.0e-6, not 1e-6)"


@pytest.mark.parametrize("env", ENVS)
def test_starpo_and_starpo_s_files_differ_only_by_preset(env: str) -> None:
    a, b = _raw(EXP_DIR / f"{env}_starpo.yaml"), _raw(EXP_DIR / f"{env}_starpo_s.yaml")
    assert (a.pop("preset"), b.pop("preset")) == ("starpo", "starpo_s")
    assert a == b


@pytest.mark.parametrize("path", FILES, ids=lambda f: f.stem)
def test_top_level_is_ragens_gpu_run(path: Path) -> None:
    env, _ = _name_parts(path)
    raw = _raw(path)
    assert "warmup" not in raw  # warm-up is a CPU-profile stage only
    cfg = load_experiment(path)
    p = build_params(cfg)
    assert cfg["iterations"] == 200
    assert p.model.endswith("Qwen2.5-0.5B-Instruct") and p.engine == "vllm"
    assert (p.env_groups, p.group_size, p.ppo_mini_batch_size) == (8, 16, 32)
    assert p.response_length == (500 if env == "bandit" else 400)
    assert p.max_turns == (5 if env in MULTI_TURN else 1)
    assert p.enable_think and p.temperature == 1.0
    assert (p.val_groups, p.val_group_size, p.val_temperature, p.test_freq) == (256, 1, 0.5, 10)
    assert p.val_envs == HELD_OUT[env]
    assert (p.actor_lr, p.critic_lr) == (1e-6, 1e-5)
    assert (p.seed, p.val_seed) == (10000, 123)
    assert p.critic_type == "separate" and not p.bf16_autocast


@pytest.mark.parametrize("path", FILES, ids=lambda f: f.stem)
def test_cpu_profile_is_small_and_uses_the_embedded_model(path: Path) -> None:
    env, _ = _name_parts(path)
    cfg = load_experiment(path, "cpu")
    p = build_params(cfg)
    assert p.model == "smollm2-135m-instruct" and p.engine == "vllm"
    assert p.enable_think is False
    # bf16 only where the CPU has bf16 instructions (ragen_rllib.hardware): emulated bf16 is 17-25x slower
    assert p.critic_type == "value_head" and p.bf16_autocast == "auto" and p.engine_dtype == "auto"
    assert p.test_freq == 5
    assert 15 <= cfg["iterations"] <= 30  # bandit: 15 (measured: val 1.0 by iteration 5); others 20
    assert cfg["rllib"]["num_env_runners"] == 0 and cfg["rllib"]["num_learners"] == 0
    if env == "bandit":  # the Bandit CPU profile
        assert (p.env_groups, p.group_size, p.temperature, p.actor_lr) == (8, 8, 1.0, 1e-5)
        assert 8 <= p.response_length <= 16
        assert p.val_groups == 64
    else:
        assert (p.env_groups, p.group_size, p.response_length, p.val_groups) == (4, 4, 48, 32)
        assert p.max_turns == (3 if env in MULTI_TURN else 1)
    assert p.val_envs == HELD_OUT[env]  # the profile keeps the held-out variants
    warmup = cfg["warmup"]
    assert warmup == {"steps": 20, "kind": "random-valid", "groups": 4, "group_size": 4}
    assert warmup["kind"] in DEMO_KINDS


@pytest.mark.parametrize("path", FILES, ids=lambda f: f.stem)
def test_train_and_val_envs_exist_in_the_registry(path: Path) -> None:
    p = build_params(load_experiment(path))
    for spec in (p.env, *p.val_envs):
        name, _, variant = spec.partition(":")
        cls = env_class(name)
        assert not variant or variant in cls.VARIANTS, f"{path.name}: {spec!r} has no such variant"
        if p.max_turns is not None and spec == p.env:
            assert p.max_turns == cls.MAX_TURNS  # top level = RAGEN's max_turn = the env's default


@pytest.mark.parametrize("profile", [None, "cpu"])
def test_set_overrides_apply(profile: str | None) -> None:
    path = EXP_DIR / "bandit_starpo_s.yaml"
    cfg = load_experiment(path, profile, ["starpo.actor_lr=2e-5", "iterations=3"])
    assert cfg["iterations"] == 3
    p = build_params(cfg)
    assert p.actor_lr == 2e-5
    assert p.rollout_filter_ratio == 0.25  # the preset still applies
    if profile == "cpu":
        assert p.model == "smollm2-135m-instruct"  # the override lands on top of the profile


def test_set_override_can_switch_the_bandit_cpu_run_to_mean_only_grpo() -> None:
    cfg = load_experiment(EXP_DIR / "bandit_starpo_s.yaml", "cpu",
                          ["starpo.adv_estimator=grpo", "starpo.grpo_norm_std=False"])
    p = build_params(cfg)
    assert (p.adv_estimator, p.grpo_norm_std, p.use_critic) == ("grpo", False, False)


@pytest.mark.parametrize("path", FILES, ids=lambda f: f.stem)
def test_bad_override_names_the_field(path: Path) -> None:
    with pytest.raises(ValueError, match="actor_lr"):
        build_params(load_experiment(path, "cpu", ["starpo.actor_lr=-1"]))


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown profile 'tpu'.*\['cpu', 'gpu'\]"):
        load_experiment(EXP_DIR / "sokoban_starpo.yaml", "tpu")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_gpu_profile_is_deepspeed_zero2_vllm_8x16(path: Path) -> None:
    cfg = load_experiment(path, "gpu")
    p = build_params(cfg)
    assert (p.engine, p.learner_backend, p.zero_stage, p.env_groups, p.group_size) == ("vllm", "deepspeed", 2, 8, 16)
    assert "Qwen2.5-0.5B-Instruct" in p.model and cfg["rllib"]["num_gpus_per_learner"] == 1


def test_loading_experiments_does_not_import_ray() -> None:
    code = ("import sys; from ragen_rllib.algorithms.starpo.train import load_experiment, build_params; "
            f"build_params(load_experiment({str(EXP_DIR / 'bandit_starpo_s.yaml')!r}, 'cpu')); "
            "print('ray' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


# ------------------------------------------------------------------ the typed Experiment (one loader)
def test_experiment_is_typed_and_frozen() -> None:
    import dataclasses

    from ragen_rllib.algorithms.starpo.experiment import Experiment

    exp = Experiment.load(ROOT / "experiments" / "bandit_starpo_s.yaml", "cpu", ["iterations=3", "warmup.steps=2"])
    assert exp.iterations == 3 and exp.warmup.steps == 2 and exp.warmup.kind == "random-valid"
    assert exp.warmup.lr is None  # the RL rate, unless set
    assert Experiment.load(ROOT / "experiments" / "bandit_starpo_s.yaml", "cpu", ["warmup.lr=5.0e-5"]).warmup.lr == 5e-5
    assert exp.rllib.num_learners == 0 and exp.tracking.log_model is True and exp.profile == "cpu"
    assert exp.mlflow_experiment == "ragen-bandit" and exp.starpo.model == "smollm2-135m-instruct"
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.iterations = 4  # type: ignore[misc]


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.experiment import Experiment

    bad = tmp_path / "bad.yaml"
    bad.write_text("preset: starpo_s\nstarpo:\n  env: bandit\n  actor_lr: [1\n")
    with pytest.raises(ValueError, match=rf"^{bad}:5:1: malformed YAML"):
        Experiment.load(bad)


@pytest.mark.parametrize("sets,match", [
    (["iteratons=3"], "did you mean 'iterations'"),
    (["tracking.log_modl=False"], "did you mean 'tracking.log_model'"),
    (["warmup.kind=oracle"], "warmup.kind must be one of"),
    (["warmup.steps=-1"], "warmup.steps must be an int >= 0"),
    (["warmup.lr=0"], r"warmup.lr must be a number > 0 or null \(starpo.actor_lr\), got 0"),
    (["warmup.lr=fast"], "warmup.lr must be a number >= 0 or null, got 'fast'"),
    (["checkpoint_freq=x"], "checkpoint_freq must be an int >= 0"),
    (["rllib.num_gpu_per_learner=1"], "did you mean 'rllib.num_gpus_per_learner'"),
    (["iterations.x=1"], "'iterations' is a single value"),
    (["noequals"], "--set expects key=value"),
])
def test_every_key_and_value_is_checked(sets: list[str], match: str) -> None:
    from ragen_rllib.algorithms.starpo.experiment import Experiment

    with pytest.raises(ValueError, match=match):
        Experiment.load(ROOT / "experiments" / "bandit_starpo_s.yaml", "cpu", sets)


def test_train_and_sweep_accept_the_same_keys(tmp_path: Path) -> None:
    """One parser: ``tracking.log_model=False`` works for ``train`` and as a sweep override (it
    used to be refused by the sweep's own parser)."""
    from ragen_rllib.algorithms.starpo.experiment import Experiment
    from ragen_rllib.algorithms.starpo.sweep_spec import load_sweep

    exp = Experiment.load(ROOT / "experiments" / "bandit_starpo_s.yaml", "cpu", ["tracking.log_model=False"])
    assert exp.tracking.log_model is False
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(ROOT / "experiments" / "bandit_starpo_s.yaml"), "profile": "cpu",
                                     "iterations": 2, "search_space": {"starpo.lam": {"grid": [0.9, 1.0]}}}))
    spec = load_sweep(sweep, ["tracking.log_model=False"])
    assert spec.experiment["tracking"]["log_model"] is False


def test_the_sweep_file_parser_is_ray_free() -> None:
    code = ("import sys; import ragen_rllib.algorithms.starpo.sweep_spec, ragen_rllib.algorithms.starpo.experiment; "
            "print('ray' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_default_config_without_its_model_fails_before_ray_starts() -> None:
    """The GPU default names a model folder this machine does not have: one line with the fix,
    and Ray never imported (let alone started)."""
    code = ("import sys, io\nfrom ragen_rllib import cli\ntry:\n"
            "    cli.main(['train', '--config', 'experiments/bandit_starpo_s.yaml'], out=io.StringIO())\n"
            "except SystemExit as e:\n    print(str(e)); print('ray' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    msg, ray_loaded = out.stdout.strip().splitlines()
    assert msg.startswith("error: starpo.model:") and "--set starpo.model=" in msg
    assert ray_loaded == "False"
