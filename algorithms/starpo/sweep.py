"""Ray Tune sweeps over StarPO / StarPO-S knobs; every trial is an MLflow run nested under one sweep run.

``ragen-rllib sweep --config experiments/sweeps/<file>.yaml`` reads a sweep file, starts one
parent MLflow run on the driver, runs a ``tune.Tuner`` over ``StarPOTrainable`` and ends with the
best trial and a comparison table and plot (``ragen_rllib.tracking.compare``) on the parent run.

The sweep file format and its validation are in ``sweep_spec.py`` (Ray-free).

Per trial, ``StarPOTrainable`` (its ``cleanup`` runs whenever the trial ends, so the MLflow run
and the Algorithm are always closed) applies the trial's dotted overrides to the experiment and
drives the same ``session.Session`` as ``train``: warm-up, then one ``algo.train()`` per Tune
step, logged to the trial's nested MLflow run (tags ``mlflow.parentRunId``, ``ragen.kind=trial``,
``ragen.trial_id``, ``ragen.trial_overrides``). ``val/*`` values are carried forward between
validations in the Tune result (not in MLflow), as Tune and ASHA want the metric in every result.

**Echo-Trap stop rule** (``EchoTrapStopper``): a trial is stopped after ``patience`` (default 2)
consecutive iterations in each of which at least one watched Echo-Trap signal is on
(``echo/<signal>`` = 1, ``tracking/echo_trap.py``). Watched by default: ``std_collapse``,
``entropy_collapse`` and ``grad_norm_spike``, the signals RAGEN ties to collapse (reward-std drop
precedes reward collapse; grad-norm spikes mark irreversible collapse). ``identical_responses``
and ``response_length_collapse`` are left out by default: a converged answer-only policy gives
short identical replies legitimately. Two iterations, because one grad-norm spike can be transient.

Legacy ``tune.run`` works with the same trainable (settings under ``config["ragen"]``, every other
key is a dotted override; the trainable ends itself after the experiment's ``iterations``)::

    from ray import tune
    from ragen_rllib.algorithms.starpo.sweep import EchoTrapStopper, StarPOTrainable, trainable_config

    analysis = tune.run(
        StarPOTrainable,
        config={**trainable_config("experiments/bandit_starpo_s.yaml", profile="cpu", overrides=["iterations=5"]),
                "starpo.rollout_filter_ratio": tune.grid_search([0.25, 1.0])},
        stop=EchoTrapStopper(), metric="rollout/success", mode="max")
    print(analysis.best_config)

Without ``parent_run_id`` such trials are top-level MLflow runs (``compare`` still reads them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ray import tune

from ragen_rllib.algorithms.starpo.experiment import Experiment, load_experiment
from ragen_rllib.algorithms.starpo.session import KEY_METRICS, Session
from ragen_rllib.algorithms.starpo.sweep_spec import (  # noqa: F401 -- re-exported: the sweep file API
    DEFAULT_STOP_SIGNALS,
    SPACE_KINDS,
    SWEEP_KEYS,
    EchoTrapStop,
    SchedulerSpec,
    SweepSpec,
    absolutize,
    apply_overrides,
    check_key,
    load_sweep,
)
from ragen_rllib.algorithms.starpo.train import build_config, init_ray
from ragen_rllib.console import log_summary, log_warning
from ragen_rllib.tracking.compare import KIND_TAG, PARENT_TAG
from ragen_rllib.tracking.echo_trap import FLAG_PREFIX, SIGNALS

#: The trainable's config key holding the sweep settings (``trainable_config``); every other key
#: of a trial config is a dotted override.
SETTINGS_KEY = "ragen"
_LOCAL_SCHEMES = ("", "sqlite", "file")


def tune_search_space(space: Mapping[str, tuple[str, Sequence[Any]]]) -> dict[str, Any]:
    """Turn ``{key: (kind, values)}`` into Tune domains (``tune.grid_search``, ``tune.choice``, ...)."""
    makers: dict[str, Callable[..., Any]] = {
        "grid": lambda v: tune.grid_search(list(v)), "choice": lambda v: tune.choice(list(v)),
        "uniform": lambda v: tune.uniform(*v), "loguniform": lambda v: tune.loguniform(*v),
        "randint": lambda v: tune.randint(*v)}
    return {key: makers[kind](values) for key, (kind, values) in space.items()}


# ------------------------------------------------------------------------------ the trainable
def trainable_config(experiment: str | os.PathLike | Mapping[str, Any], *, profile: str | None = None,
                     overrides: Sequence[str] = (), tracking_uri: str | None = None,
                     mlflow_experiment: str | None = None, parent_run_id: str | None = None,
                     run_prefix: str | None = None, resources: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Build ``{"ragen": settings}`` for ``StarPOTrainable``; add dotted override keys next to it.

    Args:
        experiment: an experiment YAML path (loaded with ``profile`` and ``overrides``) or an
            already loaded experiment dict.
        profile: profile of the YAML file.
        overrides: ``key=value`` strings, as ``--set``.
        tracking_uri: MLflow store; default the experiment's ``tracking.tracking_uri``, else
            ``sqlite:///<run_dir>/mlflow.db`` (as ``ragen-rllib train``).
        mlflow_experiment: MLflow experiment; default ``tracking.experiment`` or ``ragen-<env>``.
        parent_run_id: make every trial's run a child of this run (``mlflow.parentRunId``).
        run_prefix: trial run names are ``<run_prefix>-<trial_id>``; default ``tune-<time>``.
        resources: ``{"cpu": .., "gpu": ..}`` per trial (default 1 CPU).

    Returns:
        A dict with the single key ``SETTINGS_KEY``.
    """
    from ragen_rllib.tracking.mlflow_logger import ARTIFACTS_DIR, default_tracking_uri, get_git_commit

    if isinstance(experiment, Mapping):
        cfg = absolutize(experiment)
    else:
        cfg = absolutize(load_experiment(experiment, profile, overrides))
    exp = Experiment.from_dict(cfg)
    run_dir = Path(exp.run_dir)
    uri = tracking_uri or exp.tracking.tracking_uri or default_tracking_uri(run_dir)
    res = {"cpu": 1.0, "gpu": 0.0, **dict(resources or {})}
    return {SETTINGS_KEY: {
        "experiment": cfg,
        "tracking_uri": uri,
        "mlflow_experiment": mlflow_experiment or exp.mlflow_experiment,
        # Same artifact root as `train` for local stores (the sqlite default would be ./mlruns of the trial dir).
        "artifact_location": (run_dir / ARTIFACTS_DIR).as_uri() if urlparse(uri).scheme in _LOCAL_SCHEMES else None,
        "parent_run_id": parent_run_id,
        "run_prefix": run_prefix or time.strftime("tune-%Y%m%d-%H%M%S"),
        "resources": {"cpu": float(res["cpu"]), "gpu": float(res["gpu"])},
        "git_commit": get_git_commit(Path.cwd()) or "unknown",
    }}


class StarPOTrainable(tune.Trainable):
    """One StarPO / StarPO-S training run as a Tune trial, logged to its own (nested) MLflow run.

    ``config[SETTINGS_KEY]`` comes from ``trainable_config``; every other key of ``config`` is a
    dotted override (``starpo.rollout_filter_ratio``), applied before ``build_params`` validates.
    One ``step`` = one ``algo.train()``; the result is marked ``done`` after the experiment's
    ``iterations``. See the module docstring for what is logged and reported.
    """

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> tune.PlacementGroupFactory | None:
        """RLlib's bundles for the trial's Algorithm; the first (this process, incl. a local learner's
        GPU) raised to at least ``resources`` of the settings (``resources_per_trial``).

        Remote env runners and learners of the experiment's ``rllib`` section get their own bundles
        exactly as for RLlib's own algorithms, so they are reserved inside the trial's placement group.
        """
        from ragen_rllib.algorithms.starpo.algorithm import StarPO

        settings = config.get(SETTINGS_KEY)
        if not isinstance(settings, Mapping):
            return None  # setup() raises the clear error
        cfg = apply_overrides(settings["experiment"], {k: v for k, v in config.items() if k != SETTINGS_KEY})
        rllib = StarPO.default_resource_request(build_config(cfg, "resources"))
        head, *rest = rllib.bundles
        res = settings.get("resources") or {}
        head = {**head, "CPU": max(float(head.get("CPU", 0.0)), float(res.get("cpu", 1.0)))}
        if max(float(head.get("GPU", 0.0)), float(res.get("gpu", 0.0))) > 0:
            head["GPU"] = max(float(head.get("GPU", 0.0)), float(res.get("gpu", 0.0)))
        return tune.PlacementGroupFactory([head, *rest], strategy=rllib.strategy)

    def setup(self, config: dict[str, Any]) -> None:
        from ragen_rllib.algorithms.starpo.train import run_tags
        from ragen_rllib.tracking.mlflow_logger import MLflowTracker

        settings = config.get(SETTINGS_KEY)
        if not isinstance(settings, Mapping):
            raise ValueError(f"StarPOTrainable needs config[{SETTINGS_KEY!r}] from trainable_config(...); "
                             f"got keys {sorted(config)}")
        self.overrides = {k: v for k, v in config.items() if k != SETTINGS_KEY}
        for key in self.overrides:
            check_key(key, "StarPOTrainable config", searchable=True)
        exp = Experiment.from_dict(apply_overrides(settings["experiment"], self.overrides))
        self.run_name = f"{settings['run_prefix']}-{self.trial_id}".replace("_", "-")  # Tune ids: "1cd1b_00000"
        self.status = "FINISHED"
        self.last_val: dict[str, float] = {}
        self.algo = build_config(exp, self.run_name).build_algo()
        tags = {**run_tags(exp, self.algo), KIND_TAG: "trial", "ragen.trial_id": self.trial_id,
                "ragen.trial_overrides": json.dumps(self.overrides, sort_keys=True, default=str),
                "git_commit": settings.get("git_commit", "unknown")}
        if settings.get("parent_run_id"):
            tags[PARENT_TAG] = settings["parent_run_id"]
        run_folder = Path(exp.run_dir) / self.run_name
        # A folder per trial: concurrent trials must not share one pending-records file.
        tracker = MLflowTracker(settings["tracking_uri"], settings["mlflow_experiment"], run_name=self.run_name,
                                tags=tags, local_dir=run_folder, artifact_location=settings.get("artifact_location"))
        self.session = Session(exp, self.algo, tracker, run_folder,
                               log=lambda msg: print(f"[{self.run_name}] {msg}", flush=True))
        try:
            self.session.open(fresh=True)
            self.session.warm_up()
        except BaseException:
            self.session.close("FAILED")
            self.algo.stop()
            raise

    def step(self) -> dict[str, Any]:
        try:
            return self._iterate(self.iteration)  # completed steps so far = this step's 0-based index
        except BaseException:
            self.status = "FAILED"
            raise

    def _iterate(self, i: int) -> dict[str, Any]:
        """One RL iteration (MLflow step ``i``, as in ``train``); the final one also validates."""
        t0 = time.perf_counter()
        m = self.session.step(i, self.algo.train(), time.perf_counter() - t0)
        self.session.log_step(i, m)
        self.last_val.update({k: v for k, v in m.items() if k.startswith("val/")})
        out: dict[str, Any] = {**self.last_val, **m}
        if i + 1 >= self.session.exp.iterations:
            out["done"] = True
            final_val = self.session.validate()  # as `train`: logged at step = iterations
            self.last_val.update(final_val)
            out.update(final_val)
        return out

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        """Save the Algorithm (weights, optimizer, policy version) under ``<checkpoint_dir>/algorithm``."""
        self.algo.save_to_path(str(Path(checkpoint_dir) / "algorithm"))

    def load_checkpoint(self, checkpoint: str | dict | None) -> None:
        """Restore the Algorithm saved by ``save_checkpoint``; this trial keeps logging to its own MLflow run."""
        path = Path(str(checkpoint)) / "algorithm"
        self.algo.restore_from_path(str(path))
        self.session.tracker.set_tags({"ragen.restored_from": str(path)})

    def cleanup(self) -> None:
        done = len(self.session.history)
        try:
            self.session.summarize(dict(self.last_val))
            self.session.tracker.set_tags({"ragen.iterations_done": done,
                                           "ragen.stopped_early": str(done < self.session.exp.iterations).lower()})
        finally:
            self.session.close(self.status)
            self.algo.stop()


class EchoTrapStopper(tune.Stopper):
    """Stop a trial after ``patience`` consecutive iterations with a watched Echo-Trap signal on.

    Reads the ``echo/<signal>`` 0/1 flags that ``StarPOTrainable`` reports (``EchoTrapMonitor.flags``).
    An iteration counts when at least one of ``signals`` is 1; any iteration with none resets the
    count. See the module docstring for the choice of default signals.

    Args:
        patience: consecutive flagged iterations that stop a trial (>= 1).
        signals: names from ``tracking.echo_trap.SIGNALS``.

    Attributes:
        stopped: ``{trial_id: {"iteration": training_iteration, "signals": [...]}}`` of the trials
            this stopper ended.
    """

    def __init__(self, patience: int = 2, signals: Sequence[str] = DEFAULT_STOP_SIGNALS) -> None:
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"EchoTrapStopper.patience must be an int >= 1, got {patience!r}")
        unknown = sorted(set(signals) - set(SIGNALS))
        if unknown or not signals:
            raise ValueError(f"EchoTrapStopper.signals must be a non-empty subset of {list(SIGNALS)}, "
                             f"got {list(signals)!r}")
        self.patience = patience
        self.signals = tuple(signals)
        self.stopped: dict[str, dict[str, Any]] = {}
        self._streak: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        on = [s for s in self.signals if float(result.get(FLAG_PREFIX + s) or 0.0) >= 0.5]
        streak = self._streak.get(trial_id, 0) + 1 if on else 0
        self._streak[trial_id] = streak
        if streak >= self.patience:
            self.stopped.setdefault(trial_id, {"iteration": result.get("training_iteration"), "signals": on})
            return True
        return False

    def stop_all(self) -> bool:
        return False


class _ProgressLog(tune.Callback):
    """One line per trial result (the sweep's Tune output is otherwise silent: ``verbose=0``)."""

    def __init__(self, log: Callable[[str], None], metric: str, keys: Sequence[str], iterations: int,
                 stopper: EchoTrapStopper | None) -> None:
        self.log, self.metric, self.keys, self.iterations, self.stopper = log, metric, list(keys), iterations, stopper
        self.shown = [metric, *(k for k in KEY_METRICS if k != metric)]

    def _label(self, trial: Any) -> str:
        return " ".join([trial.trial_id, *(f"{k.split('.')[-1]}={trial.config.get(k)}" for k in self.keys)])

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.log(f"[{self._label(trial)}] started")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        shown = " ".join(f"{k if k == self.metric else k.split('/')[-1]}={result[k]:.3g}"
                         for k in self.shown if k in result)
        fired = [s for s in SIGNALS if result.get(FLAG_PREFIX + s)]  # not the echo/mi_* values
        self.log(f"[{self._label(trial)}] [{result.get('training_iteration')}/{self.iterations}] {shown}"
                 + (f" echo-trap: {','.join(fired)}" if fired else ""))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        why = ""
        if self.stopper is not None and trial.trial_id in self.stopper.stopped:
            why = f" (stopped by the Echo-Trap rule: {self.stopper.stopped[trial.trial_id]['signals']})"
        n = (trial.last_result or {}).get("training_iteration", 0)
        self.log(f"[{self._label(trial)}] finished after {n} iteration(s){why}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        log_warning(self.log, f"[{self._label(trial)}] FAILED: {trial.error_file or 'see the Tune log'}")


# ------------------------------------------------------------------------------ the driver
def run_sweep(spec: SweepSpec, tracking_uri: str | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sweep: parent MLflow run, ``tune.Tuner`` over ``StarPOTrainable``, summary, comparison.

    Starts a local Ray (``rllib.ray_num_cpus`` CPUs, default 2) unless Ray is already initialised
    or ``RAY_ADDRESS`` points at a cluster.

    Args:
        spec: from ``load_sweep``.
        tracking_uri: MLflow store (default as ``ragen-rllib train``: the experiment's, else
            ``sqlite:///<run_dir>/mlflow.db``).
        log: where progress lines go.

    Returns:
        ``{"name", "parent_run_id", "tracking_uri", "experiment", "best" (dict or None),
        "errors" ([(trial_id, first line of the error)]), "echo_trap_stopped", "rows"
        (``compare.RunRow`` list), "png" (Path or None), "table" (str)}``.
    """
    from ragen_rllib.tracking.mlflow_logger import MLflowTracker

    settings = trainable_config(spec.experiment, tracking_uri=tracking_uri, run_prefix=spec.name,
                                resources=spec.resources_per_trial)[SETTINGS_KEY]
    exp, uri, mlflow_exp = settings["experiment"], settings["tracking_uri"], settings["mlflow_experiment"]
    typed = Experiment.from_dict(exp)
    init_ray(typed)
    parent = MLflowTracker(uri, mlflow_exp, run_name=spec.name, local_dir=exp["run_dir"],
                           artifact_location=settings["artifact_location"],
                           tags={KIND_TAG: "sweep", "env": typed.starpo.env, "preset": typed.preset,
                                 "model": typed.starpo.model, "git_commit": settings["git_commit"],
                                 "sweep_source": spec.source}).start()
    settings["parent_run_id"] = parent.run_id
    status = "FAILED"
    try:
        parent.log_params({"sweep": {
            "base": exp.get("source", ""), "profile": exp.get("profile") or "default", "iterations": spec.iterations,
            "num_samples": spec.num_samples, "metric": spec.metric, "mode": spec.mode, "scheduler": spec.scheduler,
            "echo_trap_stop": spec.echo_trap_stop or "off", "max_concurrent_trials": spec.max_concurrent_trials,
            "seed": spec.seed, "search_space": {k: f"{kind} {list(v)}" for k, (kind, v) in spec.search_space.items()}}})
        parent.log_dict(json.loads(json.dumps(spec.raw, default=str)), "config/sweep.yaml")
        parent.log_dict(json.loads(json.dumps(exp, default=str)), "config/base_experiment.json")
        log(f"sweep {spec.name}: MLflow run {parent.run_id} in experiment {mlflow_exp!r} at {uri}")
        stop = spec.echo_trap_stop
        stopper = EchoTrapStopper(stop.patience, stop.signals) if stop else None
        grid = _make_tuner(spec, settings, stopper, log).fit()
        out = _summarize(grid, spec, parent, stopper, log)
        log(f"browse: mlflow ui --backend-store-uri {uri}; compare again: ragen-rllib compare {mlflow_exp} "
            f"--parent {parent.run_id}" + (f" --tracking-uri {uri}" if tracking_uri else ""))
        status = "FINISHED"
        return {"name": spec.name, "parent_run_id": parent.run_id, "tracking_uri": uri, "experiment": mlflow_exp, **out}
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        parent.end(status)


def _make_tuner(spec: SweepSpec, settings: Mapping[str, Any], stopper: EchoTrapStopper | None,
                log: Callable[[str], None]) -> tune.Tuner:
    """The Tuner: search space next to the settings, scheduler, stopper, concurrency, progress lines."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    if spec.scheduler.type == "asha":
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=spec.iterations,
                                  grace_period=spec.scheduler.grace_period,
                                  reduction_factor=spec.scheduler.reduction_factor)
    else:
        scheduler = FIFOScheduler()
    return tune.Tuner(
        StarPOTrainable,
        param_space={SETTINGS_KEY: dict(settings), **tune_search_space(spec.search_space)},
        tune_config=tune.TuneConfig(metric=spec.metric, mode=spec.mode, scheduler=scheduler,
                                    num_samples=spec.num_samples,
                                    # The generator limits concurrency itself (TuneConfig.max_concurrent_trials
                                    # is ignored for a SearchGenerator).
                                    search_alg=BasicVariantGenerator(random_state=spec.seed,
                                                                     max_concurrent=spec.max_concurrent_trials)),
        run_config=tune.RunConfig(name=spec.name, storage_path=str(Path(settings["experiment"]["run_dir"]) / "tune"),
                                  stop=stopper, verbose=0,
                                  checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=spec.checkpoint_at_end),
                                  callbacks=[_ProgressLog(log, spec.metric, list(spec.search_space), spec.iterations,
                                                          stopper)]))


def _summarize(grid: Any, spec: SweepSpec, parent: Any, stopper: EchoTrapStopper | None,
               log: Callable[[str], None]) -> dict[str, Any]:
    """Best trial, counts and the comparison (table + plot) onto the parent run; print them."""
    from ragen_rllib.tracking.compare import compare_runs, format_table, plot_comparison
    from ragen_rllib.tracking.mlflow_logger import find_runs

    uri, run_dir = parent.tracking_uri, Path(spec.experiment["run_dir"])
    errors = [(str((r.metrics or {}).get("trial_id") or Path(r.path).name), str(r.error).splitlines()[0])
              for r in grid if r.error is not None]
    children = {r["tags"].get("ragen.trial_id"): r for r in find_runs(uri, parent.experiment)
                if r["tags"].get(PARENT_TAG) == parent.run_id}
    best = _best(grid, spec, children)
    summary = {"sweep/trials": float(len(grid)), "sweep/errored": float(len(errors)),
               "sweep/echo_trap_stopped": float(len(stopper.stopped) if stopper else 0)}
    if best is not None:
        summary[f"best/{spec.metric}"] = best["value"]
        parent.set_tags({"best_trial_id": best["trial_id"], "best_run_id": best["run_id"] or "",
                         "best_overrides": json.dumps(best["overrides"], sort_keys=True, default=str)})
        parent.log_dict(best, "best_trial.json")
    parent.log_metrics(summary, step=0)
    if stopper and stopper.stopped:
        parent.log_dict(stopper.stopped, "echo_trap_stopped.json")
    rows = (compare_runs(uri, parent.experiment, spec.metric, parent_run_id=parent.run_id, mode=spec.mode)
            if children else [])
    table = format_table(rows, spec.metric, spec.mode)
    png = plot_comparison(rows, spec.metric, run_dir / spec.name / "comparison.png",
                          title=f"{spec.name}: {spec.metric}")
    if png is not None:
        parent.log_artifact(png, "compare")
    parent.log_text(table + "\n", "compare/table.txt")
    log_summary(log, table)
    if best is not None:
        log_summary(log, f"best trial {best['trial_id']} ({best['overrides']}): {spec.metric} = {best['value']:.4g} "
                         f"(final iteration), MLflow run {best['run_id']}")
    for trial_id, msg in errors:
        log_warning(log, f"trial {trial_id} failed: {msg}")
    log_summary(log, f"comparison plot: {png}")
    return {"best": best, "errors": errors, "echo_trap_stopped": dict(stopper.stopped) if stopper else {},
            "rows": rows, "png": png, "table": table}


def _best(grid: Any, spec: SweepSpec, children: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The best trial by its last reported ``spec.metric`` (Tune's ``scope="last"``), or None."""
    try:
        res = grid.get_best_result(metric=spec.metric, mode=spec.mode, scope="last", filter_nan_and_inf=True)
    except RuntimeError:  # no trial reported the metric
        return None
    trial_id = str(res.metrics.get("trial_id"))
    run = children.get(trial_id)
    return {"trial_id": trial_id, "run_id": run["run_id"] if run else None, "value": float(res.metrics[spec.metric]),
            "overrides": {k: v for k, v in res.config.items() if k != SETTINGS_KEY},
            "iterations": int(res.metrics.get("training_iteration", 0))}


# ------------------------------------------------------------------------------ validation helpers
