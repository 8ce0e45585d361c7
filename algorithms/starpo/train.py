"""``ragen-rllib train``: experiment -> StarPOConfig -> ``algo.train()`` loop, checkpoints, resume.

The experiment (file layout, loader, ``--set`` parser) is ``experiment.py``; what happens around
each iteration (MLflow, warm-up, Echo-Trap signals, validation, export) is ``session.Session``.
This module keeps the loop and what only a ``train`` run has: checkpoints and ``--resume``.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ragen_rllib.algorithms.starpo.experiment import (
    Experiment,
    build_params,
    load_experiment,
    parse_sets,
    set_dotted,
)
from ragen_rllib.algorithms.starpo.params import StarPOParams
from ragen_rllib.algorithms.starpo.session import (
    EVAL_PROTOCOL_FILE,
    KEY_METRICS,
    Session,
    eval_protocol,
    export_hf,
    flat_metrics,
)
from ragen_rllib.console import (
    LOGS_DIR,
    log_summary,
    log_warning,
    progress,
    reroute_libraries,
    route_library_output,
)
from ragen_rllib.durable import CorruptFileError, DiskFullError, disk_full_reason, fsync_path

__all__ = ["EVAL_PROTOCOL_FILE", "KEY_METRICS", "Experiment", "build_config", "build_params", "eval_protocol",
           "evaluate", "export_hf", "flat_metrics", "init_ray", "load_experiment", "load_resume_config",
           "stored_run_parts", "train"]

#: Ray system config of a local ``ray.init``: start workers on demand, not two idle ones up front.
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
#: Head processes ``ray.init`` starts that a local one-node run never uses, stopped once it is up
#: (``ray.init`` has no switch for them): the autoscaler monitor (a fixed one-node cluster never
#: scales), the log monitor (``log_to_driver=False``: workers' logs stay in their files) and the
#: dashboard's API server (no UI was asked for; a local run is no Ray Jobs target). Together
#: 0.29 GB resident (``benchmarks/memory.py``). GCS, raylet and the raylet's agents stay.
LOCAL_RAY_UNUSED = ("monitor", "log_monitor", "dashboard")
#: Signals that stop a run gracefully: the iteration in progress ends, then checkpoint, export,
#: MLflow run closed as KILLED; ``ragen-rllib train`` then exits with 128 + the signal number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def build_config(exp: Experiment | Mapping[str, Any], run_name: str):
    """The ``StarPOConfig`` of an experiment (an ``Experiment`` or its resolved dict)."""
    from ragen_rllib.algorithms.starpo.config import StarPOConfig

    exp = exp if isinstance(exp, Experiment) else Experiment.from_dict(exp)
    rl = exp.rllib
    return (StarPOConfig().training(starpo=exp.starpo)
            .env_runners(num_env_runners=rl.num_env_runners, num_cpus_per_env_runner=rl.num_cpus_per_env_runner,
                         num_gpus_per_env_runner=rl.num_gpus_per_env_runner,
                         custom_resources_per_env_runner=dict(rl.custom_resources_per_env_runner))
            .learners(num_learners=rl.num_learners, num_cpus_per_learner=rl.num_cpus_per_learner,
                      num_gpus_per_learner=rl.num_gpus_per_learner)
            .debugging(seed=exp.starpo.seed)
            .storage(run_dir=exp.run_dir, run_name=run_name))


def init_ray(exp: Experiment) -> None:
    """Connect to ``RAY_ADDRESS`` (a Ray job's driver, a chosen cluster), else start a local Ray;
    nothing when Ray is already initialised."""
    import ray

    from ragen_rllib.launch.ray_token import ensure_private_token

    if ray.is_initialized():
        return
    # A new local cluster gets a private (0600) token file, not the one Ray would write with the umask.
    ensure_private_token(create=not os.environ.get("RAY_ADDRESS"))
    if os.environ.get("RAY_ADDRESS"):  # never start a second cluster next to the one asked for
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:
        # No pre-started idle workers: a local run's learner and engine live in this process, and
        # each idle worker holds 85 MB (benchmarks/memory.py).
        ray.init(num_cpus=exp.rllib.ray_num_cpus, include_dashboard=False, log_to_driver=False,
                 _system_config=NO_PRESTART)
        stop_unused_head_processes()


def stop_unused_head_processes(kinds: Sequence[str] = LOCAL_RAY_UNUSED) -> list[str]:
    """Stop the local Ray head's processes of ``kinds`` (``LOCAL_RAY_UNUSED``); returns those stopped.

    Only for a cluster this process started (``ray.init`` without an address). Ray has no public
    handle on them, so this uses its node object; where that is missing (another Ray version) it
    stops nothing and the run goes on with them."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    processes = getattr(node, "all_processes", None)
    if not isinstance(processes, dict) or not hasattr(node, "_kill_process_type"):
        return []
    stopped = [kind for kind in kinds if processes.get(kind)]
    for kind in stopped:
        node._kill_process_type(kind, check_alive=False, wait=True)
    return stopped


def run_tags(exp: Experiment, algo: Any) -> dict[str, str]:
    """MLflow tags every run of an experiment carries (env, preset, model, code, trajectories)."""
    from ragen_rllib.launch.jobs import GIT_COMMIT_ENV, current_job_id
    from ragen_rllib.tracking.mlflow_logger import get_git_commit

    tags = {"env": exp.starpo.env, "preset": exp.preset, "model": exp.starpo.model,
            "git_commit": get_git_commit(Path.cwd()) or os.environ.get(GIT_COMMIT_ENV) or "unknown",
            "arrow_dir": str(algo.store.directory)}
    if job_id := current_job_id():
        tags["ray_job_id"] = job_id
    return tags


def train(cfg: Experiment | Mapping[str, Any], tracking_uri: str | None = None, log: Callable[[str], None] = print,
          resume: bool = False) -> dict[str, Any]:
    """Run the experiment; returns a summary (final metrics, checkpoint path, MLflow run id).

    Every ``checkpoint_freq`` iterations (0: only at the end) the algorithm is saved to
    ``<run_dir>/<run_name>/checkpoint`` (atomically replaced), *then* the iteration's metrics go to
    MLflow. ``resume=True`` (``ragen-rllib train --resume RUN``) restores that checkpoint (model,
    critic, optimizer, RNG, seed counter, iteration), reopens the same MLflow run, sends any
    checkpointed iteration the run lacks, sets aside Arrow files of iterations after the
    checkpoint, and continues. Each MLflow step is logged once: iterations logged after the last
    checkpoint (``checkpoint_freq`` > 1) are redone but keep their first attempt's metrics in
    MLflow (tag ``resume_redone_steps``); with ``checkpoint_freq`` 1 nothing is ever redone.

    SIGINT (Ctrl-C) or SIGTERM ends the run after the iteration in progress, as above but with
    the MLflow run closed as ``KILLED``; the summary's ``stop_signal`` is that signal's number.

    With a ``Console`` as ``log`` (the CLI), library output goes to ``<run>/logs/third_party.log``
    (``ragen_rllib.console``) and progress is drawn as bars on a terminal.

    Raises:
        DiskFullError: a write found no room (one line naming the file and how to go on); the
            MLflow run is closed as ``FAILED``, the previous checkpoint and Arrow files are intact.
        CorruptFileError: ``resume=True`` and a checkpoint file is truncated or damaged.
    """
    exp = cfg if isinstance(cfg, Experiment) else Experiment.from_dict(cfg)
    run_path = Path(exp.run_dir) / (exp.run_name or time.strftime("starpo-%Y%m%d-%H%M%S"))
    info = read_resume_info(run_path) if resume else None  # a bad --resume fails before the folder is written
    try:
        with route_library_output(log, run_path / LOGS_DIR):
            return _run(exp, run_path.name, tracking_uri, log, info)
    except Exception as e:  # any write, ours or a library's (its log file is in the run folder too)
        if (full := _disk_full(e, run_path)) is not None:
            raise full from e
        raise


def _run(exp: Experiment, run_name: str, tracking_uri: str | None, log: Callable[[str], None],
         info: dict[str, Any] | None) -> dict[str, Any]:
    """``train`` once the run's name is fixed and library output is routed (``info``: ``resume.json``
    of a resumed run, else None)."""
    from ragen_rllib.tracking.memory import PeakMemory
    from ragen_rllib.tracking.mlflow_logger import MLflowTracker

    run_dir = Path(exp.run_dir)
    run_path = run_dir / run_name
    memory = PeakMemory().start()  # this process and its descendants (local Ray, engine processes)
    init_ray(exp)
    config = build_config(exp, run_name)
    reroute_libraries(log)  # Ray and RLlib set up their logging when imported; vLLM, transformers, DeepSpeed do
    algo = config.build_algo()
    reroute_libraries(log)  # ... while the algorithm builds its learner and engine
    history: list[dict[str, float]] = []
    uri = tracking_uri or exp.tracking.tracking_uri
    if info is not None:
        ckpt = _checkpoint_dir(run_path)
        history = read_checkpoint_history(ckpt)  # every file checked before RLlib unpickles any
        try:
            algo.restore_from_path(str(ckpt.resolve()))
        except (EOFError, pickle.UnpicklingError) as e:  # damaged without a change of size
            raise CorruptFileError(ckpt, f"cannot restore it: {type(e).__name__}: {e}") from e
        moved = algo.set_aside
        log(f"[resume] {run_name}: restored iteration {algo.iteration} (policy_version {algo.policy_version}) from "
            f"{ckpt}" + (f"; set aside {len(moved)} later Arrow file(s)" if moved else ""))
        uri = uri or info.get("tracking_uri")
    tracker = MLflowTracker(tracking_uri=uri, experiment=exp.mlflow_experiment, run_name=run_name,
                            local_dir=run_dir, run_id=info["mlflow_run_id"] if info else None,
                            tags=run_tags(exp, algo))
    session = Session(exp, algo, tracker, run_path, log, history=history, memory=memory)
    status = "FAILED"
    prev = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop: dict[str, int] = {}
    try:
        session.open(fresh=info is None)
        for s in STOP_SIGNALS:  # before RL iterations (warm-up, catch-up) a signal ends the run at once
            signal.signal(s, _interrupt)
        if info is None:
            write_resume_info(run_path, exp.config, tracker.run_id, uri)
            session.warm_up()
        else:
            _catch_up_resumed(session, algo.iteration)
        for s in STOP_SIGNALS:  # SIGTERM (kill, a scheduler, a container stop) is handled like Ctrl-C
            signal.signal(s, lambda signum, _frame: stop.setdefault("signal", signum))
        status, t_start, start = "FINISHED", time.perf_counter(), algo.iteration
        bar = progress(log, total=exp.iterations, desc="RL iterations", initial=start)
        for i in range(start, exp.iterations):
            t0 = time.perf_counter()
            m = session.step(i, algo.train(), time.perf_counter() - t0)
            if exp.checkpoint_freq and ((i + 1) % exp.checkpoint_freq == 0 or i + 1 == exp.iterations):
                save_checkpoint(algo, run_path, session.history)
            session.log_step(i, m)
            eta = (time.perf_counter() - t_start) / (i + 1 - start) * (exp.iterations - i - 1)
            bar.step(session.progress_line(i, m, eta))  # a terminal: above the bar; else the line itself
            if stop:
                status = "KILLED"
                log_warning(log, f"interrupted: saving a checkpoint and closing the MLflow run "
                                 f"({signal.Signals(stop['signal']).name})")
                break
        bar.close()
        final_val = session.validate()
        ckpt = save_checkpoint(algo, run_path, session.history)
        hf_dir = session.export()
        tracker.set_tags({"checkpoint": str(ckpt)})
        session.summarize(final_val)
        memory.sample()
        log(f"peak memory of the run (driver + Ray + engine processes): {memory.peak_rss_gb:.2f} GB summed RSS, "
            f"{memory.peak_pss_gb:.2f} GB summed PSS (shared pages split)")
        # The whole run's peak (final validation and export included) as tags: the per-iteration
        # metric sys/peak_rss_gb already holds the peak up to each iteration, and a metric step
        # after the last iteration would read as one more logged iteration to `--resume`.
        tracker.set_tags({k.replace("/", "."): f"{v:.3f}" for k, v in memory.metrics().items()})
        log_summary(log, f"MLflow: run {tracker.run_id} (browse: mlflow ui --backend-store-uri "
                    f"{uri or 'sqlite:///' + str(run_dir / 'mlflow.db')}); trajectories: {algo.store.directory}; "
                    f"model: {hf_dir}; resume: ragen-rllib train --resume {run_name} --run-dir {run_dir}")
        return {"run_name": run_name, "mlflow_run_id": tracker.run_id, "checkpoint": str(ckpt),
                "hf_model": str(hf_dir), "final": final_val, "history": session.history,
                "stop_signal": stop.get("signal")}
    except BaseException as e:
        status = "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"  # Ctrl-C before RL (warm-up)
        raise
    finally:
        for s, handler in prev.items():
            signal.signal(s, handler)
        memory.stop()
        session.close(status)
        algo.stop()


def _interrupt(signum: int, _frame: object) -> None:
    """Before the first RL iteration there is nothing to checkpoint: SIGINT or SIGTERM ends the run
    at once, as ``KeyboardInterrupt`` named after the signal (the CLI exits with 128 + it)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _catch_up_resumed(session: Session, iteration: int) -> None:
    """A resumed run: tag it, and send the checkpointed iterations its MLflow run lacks (a crash
    between checkpoint and log); steps logged after the checkpoint stay as first logged."""
    tracker = session.tracker
    logged = tracker.last_step if tracker.last_step is not None else -1
    tags: dict[str, Any] = {"resumed_at_iteration": iteration}
    if logged >= iteration:  # logged after the last checkpoint (checkpoint_freq > 1), now redone
        tags["resume_redone_steps"] = f"{iteration}-{logged} (MLflow keeps their first attempt)"
    tracker.set_tags(tags)
    for step, m in enumerate(session.history):
        if step > logged:
            session.log_trajectories(step)
            tracker.log_metrics(m, step=step)
    session.logged = max(logged, len(session.history) - 1)


RESUME_FILE = "resume.json"
HISTORY_FILE = "ragen_history.json"
#: Size of every file of a checkpoint, written before ``HISTORY_FILE``; ``--resume`` checks them.
MANIFEST_FILE = "ragen_manifest.json"


def write_resume_info(run_path: Path, cfg: Mapping[str, Any], mlflow_run_id: str | None, uri: str | None) -> None:
    """What ``--resume`` needs besides the checkpoint: the resolved config and the MLflow run."""
    tmp = run_path / (RESUME_FILE + ".tmp")
    try:
        run_path.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"config": json.loads(json.dumps(cfg, default=str)),
                                   "mlflow_run_id": mlflow_run_id, "tracking_uri": uri}, indent=2))
        os.replace(tmp, run_path / RESUME_FILE)
    except OSError as e:
        if (reason := disk_full_reason(e)) is None:
            raise
        tmp.unlink(missing_ok=True)
        raise DiskFullError(run_path / RESUME_FILE, reason) from e


def read_resume_info(run_path: Path) -> dict[str, Any]:
    """Read ``resume.json`` of a run folder and check its checkpoint's files; errors say what is
    missing, or name the damaged file (``CorruptFileError``)."""
    f = run_path / RESUME_FILE
    if not f.is_file():
        raise FileNotFoundError(f"cannot resume {str(run_path)!r}: no {RESUME_FILE} (not a ragen-rllib run folder?)")
    read_checkpoint_history(_checkpoint_dir(run_path))  # raises if there is no (intact) checkpoint yet
    return _read_json(f)


def load_resume_config(run_path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved config a run was started with, plus ``key=value`` overrides (e.g. ``iterations=30``)."""
    run_path = Path(run_path)
    cfg = read_resume_info(run_path)["config"]
    cfg["run_name"], cfg["run_dir"] = run_path.name, str(run_path.parent)
    return set_dotted(cfg, parse_sets(overrides), where=f"--resume {run_path}: --set")


def stored_run_parts(run_path: Path) -> list[str]:
    """The parts of a stored run that ``run_path`` already holds (non-empty folders among the
    trajectory store and the checkpoint, including a checkpoint left mid-rename): a new run there
    would refuse its first Arrow write and replace that checkpoint."""
    from ragen_rllib.trajectory.store import TRAJECTORIES_DIR

    names = (TRAJECTORIES_DIR, "checkpoint", "checkpoint.old")  # the folders save_checkpoint writes
    return [n for n in names if (run_path / n).is_dir() and any((run_path / n).iterdir())]


def _checkpoint_dir(run_path: Path) -> Path:
    for name in ("checkpoint", "checkpoint.old"):  # .old: a crash between the two renames of save_checkpoint
        if (run_path / name / HISTORY_FILE).is_file():
            return run_path / name
    raise FileNotFoundError(f"cannot resume {str(run_path)!r}: no complete checkpoint in it yet")


def read_checkpoint_history(ckpt: Path) -> list[dict[str, float]]:
    """The metric history saved in checkpoint ``ckpt``, after checking that every file the
    checkpoint was written with is there, at its written size (checkpoints written before
    ``MANIFEST_FILE`` existed: the history only).

    Raises:
        CorruptFileError: names the first missing, truncated or unreadable file.
    """
    history = _read_json(ckpt / HISTORY_FILE)
    if (ckpt / MANIFEST_FILE).is_file():
        sizes = _read_json(ckpt / MANIFEST_FILE)
        for rel, size in sorted(sizes.items()):
            f = ckpt / rel
            found = f.stat().st_size if f.is_file() else None
            if found != size:
                raise CorruptFileError(f, f"{'missing' if found is None else f'{found} bytes'}, the checkpoint "
                                          f"was written with {size} bytes")
    return history


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptFileError(path, f"not valid JSON ({e})") from e


def save_checkpoint(algo: Any, run_path: Path, history: list[dict[str, float]]) -> Path:
    """``algo.save_to_path`` + the metric history, published atomically as ``<run>/checkpoint``.

    Written to ``<run>/checkpoint.tmp`` (every file fsynced, sizes in ``MANIFEST_FILE``, the
    history last), then renamed into place. A write that finds the disk full deletes the partial
    copy and raises ``DiskFullError``; the previous checkpoint is left as it was.
    """
    import shutil

    final, tmp, old = run_path / "checkpoint", run_path / "checkpoint.tmp", run_path / "checkpoint.old"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        algo.save_to_path(str(tmp.resolve()))
        files = sorted(f for f in tmp.rglob("*") if f.is_file())
        for f in files:  # on disk before the rename publishes them
            fsync_path(f)
        (tmp / MANIFEST_FILE).write_text(json.dumps({f.relative_to(tmp).as_posix(): f.stat().st_size
                                                     for f in files}))
        (tmp / HISTORY_FILE).write_text(json.dumps(history))  # written last: marks the checkpoint complete
        for f in (tmp / MANIFEST_FILE, tmp / HISTORY_FILE, *(d for d in tmp.rglob("*") if d.is_dir()), tmp):
            fsync_path(f)
    except Exception as e:
        reason = disk_full_reason(e, run_path)  # before the partial copy is deleted and frees its space
        shutil.rmtree(tmp, ignore_errors=True)
        if reason is None:
            raise
        raise DiskFullError(final, reason) from e
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    fsync_path(run_path)  # the renames themselves
    return final


def _disk_full(exc: Exception, run_path: Path) -> DiskFullError | None:
    """``exc`` as one ``DiskFullError`` line that also says how to go on; None when the disk is not full.

    A ``DiskFullError`` in the chain keeps its file (a later write, such as a log flush while the
    error unwinds, may fail too).
    """
    named, seen = exc, set()
    while named is not None and not isinstance(named, DiskFullError) and id(named) not in seen:
        seen.add(id(named))
        named = named.__cause__ or named.__context__
    if isinstance(named, DiskFullError):
        path, reason = named.path, named.reason
    elif (reason := disk_full_reason(exc, run_path)) is not None:
        path = getattr(exc, "filename", None) or run_path
    else:
        return None
    try:
        read_checkpoint_history(_checkpoint_dir(run_path))
        then = (f"the last checkpoint is intact; free space, then: ragen-rllib train --resume {run_path.name} "
                f"--run-dir {run_path.parent}")
    except (FileNotFoundError, CorruptFileError):
        then = "no checkpoint to resume from; free space and start the run again"
    return DiskFullError(path, f"{reason} ({then})")


#: ``evaluate`` policies: the model, or a demonstration policy of ``envs/demos.py`` (no model runs).
EVAL_POLICIES = ("model", "random-valid", "expert")


def evaluate(model_dir: str | Path, envs: Sequence[str] | None = None, engine: str | None = None,
             overrides: Mapping[str, Any] | None = None, log: Callable[[str], None] = print,
             policy: str = "model", protocol: Mapping[str, Any] | None = None,
             out_dir: str | Path | None = None) -> dict[str, float]:
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
        out_dir: also store each env's rollouts as ``<out_dir>/validation/<env>/iter_000000.parquet``,
            a run's validation layout, so ``scripts/paired_validation.py`` compares two evaluations
            (or an evaluation and a run's validations) state by state.

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
    from ragen_rllib.prompting.chat_format import ANSWER_CLOSE
    from ragen_rllib.trajectory import rows_to_table
    from ragen_rllib.trajectory.schema import Col
    from ragen_rllib.trajectory.store import validation_store
    from ragen_rllib.trajectory.summary import summarize

    # The rows carry the store's run id (its folder name); a bad name fails now, not after the rollouts.
    store_id = validation_store(out_dir, "check").run_id if out_dir is not None else ""
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
                               prompt=PromptConfig.from_fields(proto),
                               sampling=SamplingParams(max_new_tokens=proto["response_length"],
                                                       stop=(ANSWER_CLOSE,) if proto.get("stop_at_answer_end", False)
                                                       else (),
                                                       temperature=proto["val_temperature"]))
            groups = [(10**9 + g, proto["val_seed"] + g) for g in range(proto["val_groups"])]
            rows = RolloutLoop(eng, tok, spec).run(groups, sampling_seed=proto["val_seed"], demo_fn=demo_fn,
                                                   run_id=store_id).rows
            if out_dir is not None:
                validation_store(out_dir, env).write(0, rows_to_table(rows), overwrite=True)
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
