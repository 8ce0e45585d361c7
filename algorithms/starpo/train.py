"""``ragen-rllib train``: experiment YAML -> StarPOConfig -> ``algo.train()`` loop -> MLflow.

Experiment file layout (``experiments/*.yaml``)::

    preset: starpo_s            # starpo | starpo_s
    iterations: 200
    starpo: {env: sokoban, ...}  # StarPOParams overrides (RAGEN names)
    rllib: {num_env_runners: 0, num_learners: 0}
    tracking: {experiment: ragen-sokoban, tracking_uri: null}
    profiles:                   # named overlays, e.g. a small CPU profile
      cpu: {iterations: 20, starpo: {...}}

``--set key=value`` overrides any leaf (``starpo.actor_lr=1e-5``, ``iterations=5``).
"""

from __future__ import annotations

import ast
import copy
import math
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

from ragen_rllib.algorithms.starpo.params import PRESETS, StarPOParams

KEY_METRICS = ("rollout/success", "rollout/return_mean", "rollout/well_formed_rate", "filter/std_all_mean",
               "actor/entropy", "time/iteration")


def _merge(base: dict, over: Mapping) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def apply_overrides(cfg: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Set ``key.sub=value`` items in ``cfg`` in place (values parsed as Python literals, else strings).

    Raises:
        ValueError: an item without ``=``.
    """
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        node = cfg
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return cfg


def load_experiment(path: str | Path, profile: str | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read an experiment YAML, apply a profile and ``key=value`` overrides.

    Raises:
        FileNotFoundError: missing file. ValueError: unknown profile, bad override, bad preset.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"experiment config {str(path)!r} does not exist")
    cfg = yaml.safe_load(path.read_text()) or {}
    profiles = cfg.pop("profiles", {}) or {}
    if profile:
        if profile not in profiles:
            raise ValueError(f"{path}: unknown profile {profile!r}; profiles: {sorted(profiles)}")
        cfg = _merge(cfg, profiles[profile])
    apply_overrides(cfg, overrides)
    preset = cfg.get("preset", "starpo_s")
    if preset not in PRESETS:
        raise ValueError(f"{path}: preset must be one of {sorted(PRESETS)}, got {preset!r}")
    cfg["source"] = str(path)
    cfg["profile"] = profile
    return cfg


def build_params(cfg: Mapping[str, Any]) -> StarPOParams:
    """StarPOParams from the preset + the ``starpo`` section (validated; errors name the field)."""
    overrides = dict(cfg.get("starpo") or {})
    for name in ("val_envs", "lora_target_modules"):  # YAML lists (or one name) -> the tuple fields
        if name in overrides:
            value = overrides[name]
            overrides[name] = (value,) if isinstance(value, str) else tuple(value)
    overrides.setdefault("total_training_steps", int(cfg.get("iterations", 0) or 0))  # the LR schedule's horizon
    return PRESETS[cfg.get("preset", "starpo_s")](**overrides)


#: Ray system config of a local ``ray.init``: start workers on demand, not two idle ones up front.
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
#: Keys of an experiment's ``rllib:`` section (RLlib resources; ``ray_num_cpus`` for a local ray.init).
RLLIB_KEYS = ("num_env_runners", "num_cpus_per_env_runner", "num_gpus_per_env_runner",
              "custom_resources_per_env_runner", "num_learners", "num_cpus_per_learner", "num_gpus_per_learner",
              "ray_num_cpus")


def build_config(cfg: Mapping[str, Any], run_name: str):
    from ragen_rllib.algorithms.starpo.config import StarPOConfig

    params = build_params(cfg)
    rl = dict(cfg.get("rllib") or {})
    if unknown := sorted(set(rl) - set(RLLIB_KEYS)):
        raise ValueError(f"rllib: unknown key(s) {unknown}; known: {sorted(RLLIB_KEYS)}")
    conf = (StarPOConfig().training(starpo=params)
            .env_runners(num_env_runners=int(rl.get("num_env_runners", 0)),
                         num_cpus_per_env_runner=rl.get("num_cpus_per_env_runner", 1),
                         num_gpus_per_env_runner=rl.get("num_gpus_per_env_runner", 0),
                         custom_resources_per_env_runner=dict(rl.get("custom_resources_per_env_runner") or {}))
            .learners(num_learners=int(rl.get("num_learners", 0)),
                      num_cpus_per_learner=rl.get("num_cpus_per_learner", "auto"),
                      num_gpus_per_learner=rl.get("num_gpus_per_learner", 0))
            .debugging(seed=params.seed)
            .storage(run_dir=cfg.get("run_dir", "runs"), run_name=run_name))
    return conf


def flat_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """Pick our namespaced scalar metrics out of an RLlib result dict."""
    out: dict[str, float] = {}

    def walk(prefix: str, d: Any) -> None:
        if isinstance(d, Mapping):
            for k, v in d.items():
                walk(f"{prefix}{k}" if not prefix else f"{prefix}/{k}", v)
        elif isinstance(d, (int, float)) and not isinstance(d, bool):
            if math.isfinite(float(d)):  # RLlib reports keys not logged this iteration (e.g. val/) as NaN
                out[prefix] = float(d)

    for k, v in result.items():
        if isinstance(k, str) and k.split("/")[0] in ("rollout", "filter", "actor", "critic", "time", "val", "learner",
                                                      "faults", "policy_version"):
            walk(k, v)
    return out


def train(cfg: dict[str, Any], tracking_uri: str | None = None, log: Callable[[str], None] = print,
          resume: bool = False) -> dict[str, Any]:
    """Run the experiment; returns a summary (final metrics, checkpoint path, MLflow run id).

    Every ``checkpoint_freq`` iterations (experiment key, default 1) the algorithm is saved to
    ``<run_dir>/<run_name>/checkpoint`` (atomically replaced), *then* the iteration's metrics go to
    MLflow. ``resume=True`` (``ragen-rllib train --resume RUN``) restores that checkpoint (model,
    critic, optimizer, RNG, seed counter, iteration), reopens the same MLflow run, sends any
    checkpointed iteration the run lacks, sets aside Arrow files of iterations after the
    checkpoint, and continues. Each MLflow step is logged once: iterations logged after the last
    checkpoint (``checkpoint_freq`` > 1) are redone but keep their first attempt's metrics in
    MLflow (tag ``resume_redone_steps``); with ``checkpoint_freq`` 1 nothing is ever redone.
    """
    import ray

    from ragen_rllib.launch.jobs import GIT_COMMIT_ENV, current_job_id
    from ragen_rllib.tracking.echo_trap import EchoTrapMonitor
    from ragen_rllib.tracking.memory import PeakMemory
    from ragen_rllib.tracking.mlflow_logger import MLflowTracker, get_git_commit

    run_name = cfg.get("run_name") or time.strftime("starpo-%Y%m%d-%H%M%S")
    run_dir = Path(cfg.get("run_dir", "runs"))
    run_path = run_dir / run_name
    params = build_params(cfg)
    iterations = int(cfg.get("iterations", 10))
    ckpt_freq = int(cfg.get("checkpoint_freq", 1))
    tr = dict(cfg.get("tracking") or {})
    uri = tracking_uri or tr.get("tracking_uri")
    info = read_resume_info(run_path) if resume else None
    memory = PeakMemory().start()  # this process and its descendants (local Ray, engine processes)
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):  # a Ray job's driver / a chosen cluster: connect, never start one
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            # No pre-started idle workers: a local run's learner and engine live in this process, and
            # each idle worker holds 85 MB (benchmarks/memory.py).
            ray.init(num_cpus=int((cfg.get("rllib") or {}).get("ray_num_cpus", 2)), include_dashboard=False,
                     log_to_driver=False, _system_config=NO_PRESTART)
    algo = build_config(cfg, run_name).build_algo()
    history: list[dict[str, float]] = []
    if info is not None:
        ckpt = _checkpoint_dir(run_path)
        algo.restore_from_path(str(ckpt.resolve()))
        history = json.loads((ckpt / HISTORY_FILE).read_text())
        moved = algo.set_aside
        log(f"[resume] {run_name}: restored iteration {algo.iteration} (policy_version {algo.policy_version}) from "
            f"{ckpt}" + (f"; set aside {len(moved)} later Arrow file(s)" if moved else ""))
        uri = uri or info.get("tracking_uri")
    tracker = MLflowTracker(tracking_uri=uri, experiment=tr.get("experiment", f"ragen-{params.env.split(':')[0]}"),
                            run_name=run_name, local_dir=run_dir,
                            run_id=info["mlflow_run_id"] if info else None,
                            tags={"env": params.env, "preset": cfg.get("preset", "starpo_s"), "model": params.model,
                                  "git_commit": get_git_commit(Path.cwd()) or os.environ.get(GIT_COMMIT_ENV)
                                  or "unknown",
                                  "arrow_dir": str(algo.store.directory),
                                  **({"ray_job_id": job_id} if (job_id := current_job_id()) else {})})
    tracker.start()
    if info is None:
        tracker.log_params({"starpo": params, "iterations": iterations, "rllib": cfg.get("rllib") or {},
                            "profile": cfg.get("profile") or "default", "source": cfg.get("source", "")})
        tracker.log_dict(json.loads(json.dumps(cfg, default=str)), "config/resolved.json")
        write_resume_info(run_path, cfg, tracker.run_id, uri)
        warm = cfg.get("warmup") or {}
        if warm.get("steps"):
            log(f"[warm-up] {warm['steps']} supervised steps on {warm.get('kind', 'random-valid')} demonstrations")
            for s, m in enumerate(algo.warmup(int(warm["steps"]), warm.get("kind", "random-valid"),
                                              groups=int(warm.get("groups", 4)),
                                              group_size=int(warm.get("group_size", 4)))):
                tracker.log_metrics({f"warmup/{k.split('/')[-1]}": v for k, v in m.items()}, step=s)
    logged = -1  # MLflow steps <= this are already in the run (each step is logged once)
    if info is not None:
        logged = tracker.last_step if tracker.last_step is not None else -1
        tags = {"resumed_at_iteration": algo.iteration}
        if logged >= algo.iteration:  # logged after the last checkpoint (checkpoint_freq > 1), now redone
            tags["resume_redone_steps"] = f"{algo.iteration}-{logged} (MLflow keeps their first attempt)"
        tracker.set_tags(tags)
        for step, m in enumerate(history):  # checkpointed iterations the crash kept from MLflow
            if step > logged:
                tracker.log_metrics(m, step=step)
        logged = max(logged, len(history) - 1)
    monitor = EchoTrapMonitor()
    for step, m in enumerate(history):
        monitor.update(m, step=step)
    stop = {"flag": False}
    prev = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__("flag", True))
    status, t_start, start = "FINISHED", time.perf_counter(), algo.iteration
    try:
        for i in range(start, iterations):
            t0 = time.perf_counter()
            result = algo.train()
            m = flat_metrics(result)
            m["time/iteration"] = time.perf_counter() - t0
            m.update(memory.metrics())
            for sig in monitor.update(m, step=i):
                log(sig.message)
            m.update(monitor.flags())
            history.append(m)
            if ckpt_freq and ((i + 1) % ckpt_freq == 0 or i + 1 == iterations):
                save_checkpoint(algo, run_path, history)
            if i > logged:
                tracker.log_metrics(m, step=i)
            eta = (time.perf_counter() - t_start) / (i + 1 - start) * (iterations - i - 1)
            shown = " ".join(f"{k.split('/')[-1]}={m[k]:.3g}" for k in KEY_METRICS if k in m)
            val = " ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("val/") and k.endswith("/success"))
            log(f"[{i + 1}/{iterations}] {shown} {val} eta {eta:.0f}s")
            if stop["flag"]:
                status = "KILLED"
                log("interrupted: saving a checkpoint and closing the MLflow run")
                break
        final_val = algo.validate() if params.test_freq else {}
        tracker.log_metrics(final_val, step=len(history))
        if final_val:
            log(" ".join(f"{k}={v:.3f}" for k, v in final_val.items()))
        ckpt = save_checkpoint(algo, run_path, history)
        hf_dir = export_hf(algo, run_path / "hf_model")
        (hf_dir / EVAL_PROTOCOL_FILE).write_text(json.dumps(eval_protocol(params), indent=2))
        tracker.set_tags({"checkpoint": str(ckpt), "hf_model": str(hf_dir)})
        if tr.get("log_model", True):  # the final policy as a Hugging Face folder (transformers / vLLM)
            tracker.log_artifact(str(hf_dir), "hf_model")
        _log_curves(tracker, history, run_path)
        _print_summary(history, final_val, log)
        memory.sample()
        log(f"peak memory of the run (driver + Ray + engine processes): {memory.peak_rss_gb:.2f} GB summed RSS, "
            f"{memory.peak_pss_gb:.2f} GB summed PSS (shared pages split)")
        # The whole run's peak (final validation and export included) as tags: the per-iteration
        # metric sys/peak_rss_gb already holds the peak up to each iteration, and a metric step
        # after the last iteration would read as one more logged iteration to `--resume`.
        tracker.set_tags({k.replace("/", "."): f"{v:.3f}" for k, v in memory.metrics().items()})
        log(f"MLflow: run {tracker.run_id} (browse: mlflow ui --backend-store-uri "
            f"{uri or 'sqlite:///' + str(run_dir / 'mlflow.db')}); "
            f"trajectories: {algo.store.directory}; model: {hf_dir}; resume: ragen-rllib train --resume {run_name} "
            f"--run-dir {run_dir}")
        return {"run_name": run_name, "mlflow_run_id": tracker.run_id, "checkpoint": str(ckpt),
                "hf_model": str(hf_dir), "final": final_val, "history": history}
    except BaseException:
        status = "FAILED"
        raise
    finally:
        signal.signal(signal.SIGINT, prev)
        memory.stop()
        tracker.end(status=status)
        algo.stop()


RESUME_FILE = "resume.json"
HISTORY_FILE = "ragen_history.json"


def write_resume_info(run_path: Path, cfg: Mapping[str, Any], mlflow_run_id: str | None, uri: str | None) -> None:
    """What ``--resume`` needs besides the checkpoint: the resolved config and the MLflow run."""
    run_path.mkdir(parents=True, exist_ok=True)
    tmp = run_path / (RESUME_FILE + ".tmp")
    tmp.write_text(json.dumps({"config": json.loads(json.dumps(cfg, default=str)), "mlflow_run_id": mlflow_run_id,
                               "tracking_uri": uri}, indent=2))
    os.replace(tmp, run_path / RESUME_FILE)


def read_resume_info(run_path: Path) -> dict[str, Any]:
    """Read ``resume.json`` of a run folder; errors say what is missing."""
    f = run_path / RESUME_FILE
    if not f.is_file():
        raise FileNotFoundError(f"cannot resume {str(run_path)!r}: no {RESUME_FILE} (not a ragen-rllib run folder?)")
    _checkpoint_dir(run_path)  # raises if there is no checkpoint yet
    return json.loads(f.read_text())


def load_resume_config(run_path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved config a run was started with, plus ``key=value`` overrides (e.g. ``iterations=30``)."""
    run_path = Path(run_path)
    cfg = read_resume_info(run_path)["config"]
    cfg["run_name"], cfg["run_dir"] = run_path.name, str(run_path.parent)
    return apply_overrides(cfg, overrides)


def _checkpoint_dir(run_path: Path) -> Path:
    for name in ("checkpoint", "checkpoint.old"):  # .old: a crash between the two renames of save_checkpoint
        if (run_path / name / HISTORY_FILE).is_file():
            return run_path / name
    raise FileNotFoundError(f"cannot resume {str(run_path)!r}: no complete checkpoint in it yet")


def save_checkpoint(algo: Any, run_path: Path, history: list[dict[str, float]]) -> Path:
    """``algo.save_to_path`` + the metric history, published atomically as ``<run>/checkpoint``."""
    import shutil

    final, tmp, old = run_path / "checkpoint", run_path / "checkpoint.tmp", run_path / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    algo.save_to_path(str(tmp.resolve()))
    (tmp / HISTORY_FILE).write_text(json.dumps(history))  # written last: marks the checkpoint complete
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def export_hf(algo: Any, out: Path) -> Path:
    """Save the trained policy as a Hugging Face folder (loadable by transformers and vLLM)."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.models import resolve_model

    src = resolve_model(algo.config.starpo.model)
    weights = next(iter(algo.learner_group.foreach_learner(lambda lrn: lrn.policy_weights()))).get()
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32, local_files_only=True)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(src), local_files_only=True).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _log_curves(tracker: Any, history: list[dict[str, float]], out_dir: Path) -> None:
    from ragen_rllib.tracking.plots import plot_curves

    keys = [k for k in ("rollout/success", "filter/std_all_mean", "actor/entropy", "rollout/response_length_mean")
            if any(k in h for h in history)]
    keys += sorted({k for h in history for k in h if k.startswith("val/") and k.endswith("/success")})
    png = plot_curves(history, keys, out_dir / "learning_curves.png", title=out_dir.name)
    if png is not None:
        tracker.log_artifact(str(png))


EVAL_PROTOCOL_FILE = "ragen_eval_protocol.json"


def eval_protocol(p: StarPOParams) -> dict[str, Any]:
    """The validation protocol of a run, saved next to its exported model so ``eval`` repeats it."""
    return {"val_envs": list(p.val_envs or (p.env,)), "val_groups": p.val_groups, "val_group_size": p.val_group_size,
            "val_temperature": p.val_temperature, "val_seed": p.val_seed, "enable_think": p.enable_think,
            "response_length": p.response_length, "max_turns": p.max_turns, "engine": p.engine,
            "max_context_tokens": p.max_context_tokens, "max_actions_per_turn": p.max_actions_per_turn,
            "format_penalty": p.format_penalty, "env_config": dict(p.env_config)}


#: ``evaluate`` policies: the model, or a demonstration policy of ``envs/demos.py`` (no model runs).
EVAL_POLICIES = ("model", "random-valid", "expert")


def evaluate(model_dir: str | Path, envs: Sequence[str] | None = None, engine: str | None = None,
             overrides: Mapping[str, Any] | None = None, log: Callable[[str], None] = print,
             policy: str = "model", protocol: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Evaluate a model, or a reference policy, with a run's validation protocol.

    The protocol is ``protocol`` (``eval_protocol(params)`` of an experiment), else the one saved
    next to an exported model, else the defaults; ``overrides`` change it key by key. The same
    fixed initial states (``val_seed`` + 0..``val_groups``-1) and rollout loop serve every policy,
    so a trained model, the untrained one and the baselines are compared state for state.

    Args:
        model_dir: a run folder, its ``hf_model`` folder, or any local HF model folder (the
            untrained model). With a demonstration ``policy`` only its tokenizer is used.
        policy: ``"model"``, or ``"random-valid"`` (uniformly random valid actions in the answer
            format) or ``"expert"`` (BFS / shortest-path plans: the ceiling), see ``EVAL_POLICIES``.

    Returns ``{<env>/success, <env>/success_ci95, <env>/pass@k, <env>/well_formed_rate}``.
    """
    if policy not in EVAL_POLICIES:
        raise ValueError(f"policy must be one of {list(EVAL_POLICIES)}, got {policy!r}")
    import numpy as np

    from ragen_rllib.algorithms.starpo.algorithm import pass_at_k, success_ci95
    from ragen_rllib.env_runners.engine import SamplingParams
    from ragen_rllib.env_runners.rollout_job import make_engine
    from ragen_rllib.env_runners.rollout_loop import RolloutLoop, RolloutSpec
    from ragen_rllib.models.loading import load_tokenizer
    from ragen_rllib.prompting import PromptConfig
    from ragen_rllib.trajectory import rows_to_table
    from ragen_rllib.trajectory.schema import Col
    from ragen_rllib.trajectory.summary import summarize

    model_dir = Path(model_dir)
    if (model_dir / "hf_model").is_dir():  # a run folder or checkpoint parent
        model_dir = model_dir / "hf_model"
    f = model_dir / EVAL_PROTOCOL_FILE
    if protocol is not None:
        proto = dict(protocol)
    else:
        proto = json.loads(f.read_text()) if f.is_file() else eval_protocol(StarPOParams())
    proto.update(dict(overrides or {}))
    tok = load_tokenizer(str(model_dir))
    demo_fn = None
    if policy == "model":
        eng = make_engine(engine or proto["engine"], str(model_dir), seed=proto["val_seed"],
                          max_model_len=proto["max_context_tokens"] + proto["response_length"])
    else:  # the reply comes from the policy; the loop only needs the stop token to close each reply
        from ragen_rllib.envs.demos import make_demo_fn

        eng = _StopTokensOnly((tok.eos_token_id,) if tok.eos_token_id is not None else ())
        demo_fn = make_demo_fn(policy, seed=int(proto["val_seed"]), enable_think=bool(proto["enable_think"]),
                               max_actions=int(proto["max_actions_per_turn"]))
    out: dict[str, float] = {}
    try:
        for env in envs or proto["val_envs"]:
            name, _, variant = env.partition(":")
            spec = RolloutSpec(env_name=name, env_variant=variant or None, env_config=proto["env_config"],
                               group_size=proto["val_group_size"], max_turns=proto["max_turns"],
                               prompt=PromptConfig(enable_think=proto["enable_think"],
                                                   max_actions_per_turn=proto["max_actions_per_turn"],
                                                   format_penalty=proto["format_penalty"],
                                                   max_context_tokens=proto["max_context_tokens"]),
                               sampling=SamplingParams(max_new_tokens=proto["response_length"],
                                                       temperature=proto["val_temperature"]))
            groups = [(10**9 + g, proto["val_seed"] + g) for g in range(proto["val_groups"])]
            rows = RolloutLoop(eng, tok, spec).run(groups, sampling_seed=proto["val_seed"], demo_fn=demo_fn).rows
            mean, half = success_ci95(np.array([r[Col.SUCCESS] for r in rows], dtype=float))
            per_state: dict[int, list[bool]] = {}
            for r in rows:
                per_state.setdefault(r[Col.GROUP_ID], []).append(bool(r[Col.SUCCESS]))
            k = proto["val_group_size"]
            out.update({f"{env}/success": mean, f"{env}/success_ci95": half,
                        f"{env}/pass@{k}": pass_at_k(list(per_state.values()), k),
                        f"{env}/well_formed_rate": summarize(rows_to_table(rows))["well_formed_rate"]})
            log(f"{env} [{policy}]: success {mean:.3f} ± {half:.3f} (95% CI, {len(rows)} episodes), pass@{k} "
                f"{out[f'{env}/pass@{k}']:.3f}, well-formed {out[f'{env}/well_formed_rate']:.3f}")
    finally:
        close = getattr(eng, "close", None)
        if callable(close):
            close()
    return out


class _StopTokensOnly:
    """The part of an ``Engine`` the rollout loop reads when a demonstration policy replies."""

    policy_version = 0

    def __init__(self, eos_token_ids: tuple[int, ...]) -> None:
        self.eos_token_ids = eos_token_ids


def _print_summary(history: list[dict[str, float]], final_val: Mapping[str, float], log: Callable[[str], None]) -> None:
    if not history:
        return
    keys = [k for k in ("rollout/success", "rollout/return_mean", "rollout/well_formed_rate", "filter/std_all_mean",
                        "filter/zero_std_frac", "actor/entropy", "actor/grad_norm", "rollout/response_length_mean",
                        "time/iteration") if k in history[-1]]
    log(f"{'metric':<32} {'first':>10} {'last':>10}")
    for k in keys:
        log(f"{k:<32} {history[0].get(k, float('nan')):>10.4g} {history[-1].get(k, float('nan')):>10.4g}")
    for k, v in final_val.items():
        log(f"{'final ' + k:<32} {'':>10} {v:>10.4g}")
