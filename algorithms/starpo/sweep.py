"""Ray Tune sweeps over StarPO / StarPO-S knobs; every trial is an MLflow run nested under one sweep run.

``ragen-rllib sweep --config experiments/sweeps/<file>.yaml`` reads a sweep file, starts one
parent MLflow run on the driver, runs a ``tune.Tuner`` over ``StarPOTrainable`` and ends with the
best trial and a comparison table and plot (``ragen_rllib.tracking.compare``) on the parent run.

Sweep file (keys ``SWEEP_KEYS``; errors name the bad key and value)::

    base: ../bandit_starpo_s.yaml     # experiment file, relative to the sweep file
    profile: cpu                      # a profile of the base file (optional)
    iterations: 10                    # RL iterations per trial (default: the experiment's)
    overrides: {warmup.steps: 10}     # fixed dotted overrides for every trial (like --set)
    search_space:                     # dotted keys: preset, starpo.<StarPOParams field>, warmup.*, rllib.*
      starpo.rollout_filter_ratio: {grid: [0.25, 0.5, 1.0]}
      starpo.clip_ratio_high: {choice: [0.2, 0.28]}   # also uniform / loguniform: [lo, hi], randint: [lo, hi)
    num_samples: 1                    # Tune semantics: each grid point num_samples times
    metric: rollout/success           # or val/<env>/success (validated envs only)
    mode: max
    scheduler: {type: asha, grace_period: 3, reduction_factor: 2}   # or null / fifo
    echo_trap_stop: true              # or {patience: 2, signals: [std_collapse, ...]}
    max_concurrent_trials: 1
    resources_per_trial: {cpu: 1, gpu: 0}   # at least this for a trial's process; remote runners/learners add theirs
    seed: 0                           # random state of Tune's sampling (choice / uniform / ...)
    checkpoint_at_end: false          # true: each trial's Algorithm checkpoint in runs/tune/<name>/<trial>/

Per trial, ``StarPOTrainable`` (a ``tune.Trainable``: its ``cleanup`` runs when a scheduler or
stopper ends the trial, so the MLflow run and the Algorithm are always closed) applies the
trial's dotted overrides to the experiment dict, builds ``StarPOConfig`` with ``build_config``
and the Algorithm, runs the experiment's warm-up, then one ``algo.train()`` per Tune step. Each
step's flat metrics (``train.flat_metrics`` + ``echo/*`` flags) go to the trial's MLflow run
(tags ``mlflow.parentRunId`` = the sweep run, ``ragen.kind=trial``, ``ragen.trial_id``,
``ragen.trial_overrides``) and are returned to Tune; ``val/*`` values are carried forward between
validations in the Tune result (not in MLflow) so a ``val/`` metric is in every result, as Tune
and ASHA require.

**Echo-Trap stop rule** (``EchoTrapStopper``): a trial is stopped after ``patience`` (default 2)
consecutive iterations in each of which at least one watched Echo-Trap signal is on
(``echo/<signal>`` = 1, ``tracking/echo_trap.py``). Watched by default: ``std_collapse``,
``entropy_collapse`` and ``grad_norm_spike``, the signals RAGEN ties to collapse (reward-std drop
precedes reward collapse; grad-norm spikes mark irreversible collapse). ``identical_responses``
and ``response_length_collapse`` are left out by default because a converged answer-only policy
(no ``<think>``, e.g. the Bandit CPU profile) legitimately gives short identical replies; list
them in ``signals`` for reasoning runs. Two iterations, not one, because a single grad-norm spike
can be transient.

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

Without ``parent_run_id`` such trials are top-level MLflow runs; ``ragen-rllib compare`` still
compares them.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import json
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml
from ray import tune

from ragen_rllib.algorithms.starpo.params import StarPOParams
from ragen_rllib.algorithms.starpo.train import (
    KEY_METRICS,
    _log_curves,
    build_config,
    build_params,
    flat_metrics,
    load_experiment,
)
from ragen_rllib.envs.demos import DEMO_KINDS
from ragen_rllib.tracking.compare import KIND_TAG, MODES, PARENT_TAG
from ragen_rllib.tracking.echo_trap import (
    ENTROPY_COLLAPSE,
    FLAG_PREFIX,
    GRAD_NORM_SPIKE,
    SIGNALS,
    STD_COLLAPSE,
    EchoTrapMonitor,
)

#: The trainable's config key holding the sweep settings (``trainable_config``); every other key
#: of a trial config is a dotted override.
SETTINGS_KEY = "ragen"
SWEEP_KEYS = ("base", "profile", "iterations", "overrides", "search_space", "num_samples", "metric", "mode",
              "scheduler", "echo_trap_stop", "max_concurrent_trials", "resources_per_trial", "seed", "name",
              "checkpoint_at_end")
SPACE_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
SCHEDULERS = ("fifo", "asha")
#: Echo-Trap signals watched by ``EchoTrapStopper`` unless told otherwise (see the module docstring).
DEFAULT_STOP_SIGNALS = (STD_COLLAPSE, ENTROPY_COLLAPSE, GRAD_NORM_SPIKE)
#: Leaf names allowed under each experiment section in a dotted key. ``rllib.<name>`` leaves are
#: checked by ``train.build_config`` when a trial starts (that set lives there).
SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "starpo": tuple(f.name for f in dataclasses.fields(StarPOParams)),
    "warmup": ("steps", "kind", "groups", "group_size"),
    "tracking": ("experiment", "tracking_uri"),
}
OPEN_SECTIONS = ("rllib",)
#: Keys that may vary per trial; ``tracking.*``, ``run_dir`` and ``iterations`` are sweep-wide.
SEARCHABLE = ("preset", "starpo", "warmup", "rllib")
FIXED_ONLY = ("tracking", "run_dir", "iterations")
#: Purely discrete search spaces up to this many combinations are validated point by point up front.
MAX_CHECKED_COMBINATIONS = 512
_LOCAL_SCHEMES = ("", "sqlite", "file")
# Sweep and trial names become Arrow store run ids (trajectory/store.py accepts these characters).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]*")


@dataclass(frozen=True)
class EchoTrapStop:
    """The Echo-Trap stop rule of a sweep: ``patience`` consecutive iterations with any of ``signals`` on."""

    patience: int = 2
    signals: tuple[str, ...] = DEFAULT_STOP_SIGNALS


@dataclass(frozen=True)
class SchedulerSpec:
    """``fifo`` (run every trial to the end) or ``asha`` (successive halving on ``metric``).

    Attributes:
        type: ``fifo`` or ``asha``.
        grace_period: ASHA: iterations before a trial can be stopped (>= 1, <= iterations).
        reduction_factor: ASHA: 1/reduction_factor of the trials go on at each rung (> 1).
    """

    type: str = "fifo"
    grace_period: int = 1
    reduction_factor: float = 2.0


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep file (``load_sweep``).

    Attributes:
        source: the sweep file.
        name: sweep name: the parent MLflow run's name, the Tune experiment folder, the trials' run prefix.
        experiment: the base experiment dict after its profile, the fixed overrides and ``iterations``
            (``run_dir`` and local model paths made absolute: Tune runs trials in other folders).
        search_space: ``{dotted key: (kind, values)}``, kind in ``SPACE_KINDS``.
        iterations: RL iterations per trial (ASHA's ``max_t``).
        num_samples: Tune's ``num_samples``.
        metric, mode: what ``best`` means (Tune, ASHA, the parent run's summary, the comparison).
        scheduler: see ``SchedulerSpec``.
        echo_trap_stop: the stop rule, or None for no Echo-Trap stopping.
        max_concurrent_trials: trials running at once.
        resources_per_trial: ``{"cpu": float, "gpu": float}``: at least this for each trial's own
            process (which holds the local env runner and learner); remote env runners / learners of
            the experiment's ``rllib`` section get RLlib's own bundles on top.
        seed: random state of Tune's sampling (None: unseeded).
        checkpoint_at_end: save each trial's Algorithm at its end (Tune's trial folder). Off by
            default: with a 135M model and a critic a checkpoint (weights + Adam state) is about 1.5 GB.
        raw: the sweep file's content after ``--set`` (logged to the parent run).
    """

    source: str
    name: str
    experiment: Mapping[str, Any]
    search_space: Mapping[str, tuple[str, tuple[Any, ...]]]
    iterations: int
    num_samples: int = 1
    metric: str = "rollout/success"
    mode: str = "max"
    scheduler: SchedulerSpec = field(default_factory=SchedulerSpec)
    echo_trap_stop: EchoTrapStop | None = None
    max_concurrent_trials: int = 1
    resources_per_trial: Mapping[str, float] = field(default_factory=lambda: {"cpu": 1.0, "gpu": 0.0})
    seed: int | None = 0
    checkpoint_at_end: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------ sweep files
def load_sweep(path: str | os.PathLike, overrides: Sequence[str] = ()) -> SweepSpec:
    """Read and validate a sweep file; ``overrides`` are ``key=value`` strings (``--set``).

    A ``--set`` key whose first part is a sweep key (``iterations=3``, ``scheduler.grace_period=2``,
    ``search_space.starpo.lam={'grid': [0.9, 1.0]}``) changes the sweep file; any other key
    (``starpo.actor_lr=2e-5``, ``warmup.steps=5``) is a fixed override of the base experiment.

    Every grid/choice value and range end of the search space is checked by building the trial's
    ``StarPOParams``; purely discrete spaces of up to ``MAX_CHECKED_COMBINATIONS`` points are
    checked point by point, so a bad combination fails here, not in trial 7.

    Raises:
        FileNotFoundError: the sweep file or its base experiment does not exist.
        ValueError: anything invalid; the message names the file, the key and the bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep config {str(path)!r} does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a sweep file is a mapping with keys {list(SWEEP_KEYS)}, got {type(raw).__name__}")
    raw = _apply_sweep_sets(copy.deepcopy(raw), overrides, path)
    unknown = sorted(set(raw) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; a sweep file has {list(SWEEP_KEYS)}")
    base = raw.get("base")
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path}: 'base' must name the experiment file (relative to the sweep file), got {base!r}")
    base_path = Path(base) if Path(base).is_absolute() else path.parent / base
    if not base_path.is_file():
        raise FileNotFoundError(f"{path}: base experiment {str(base_path)!r} does not exist")
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ValueError(f"{path}: 'profile' must be a profile name or null, got {profile!r}")
    fixed = _mapping(raw.get("overrides"), f"{path}: 'overrides'")
    for key in fixed:
        check_key(key, f"{path}: overrides", searchable=False)
    experiment = load_experiment(base_path, profile)  # ValueError names an unknown profile
    experiment = apply_overrides(experiment, fixed)
    iterations = _int(raw.get("iterations", experiment.get("iterations", 10)), f"{path}: 'iterations'", 1)
    experiment["iterations"] = iterations
    experiment = absolutize(experiment)
    _check_trial(experiment, {}, f"{path}: the base experiment (with 'overrides')")

    space_raw = _mapping(raw.get("search_space"), f"{path}: 'search_space'")
    if not space_raw:
        raise ValueError(f"{path}: 'search_space' must map at least one dotted key to e.g. {{grid: [...]}}")
    space: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for key, spec in space_raw.items():
        check_key(key, f"{path}: search_space", searchable=True)
        if key in fixed:
            raise ValueError(f"{path}: {key!r} is both a fixed override and in search_space; keep one")
        space[key] = _parse_domain(key, spec, path)
        for value in _probe_values(*space[key]):
            _check_trial(experiment, {key: value}, f"{path}: search_space[{key!r}] value {value!r}")
    _check_combinations(experiment, space, path)

    metric = raw.get("metric", "rollout/success")
    if not isinstance(metric, str) or "/" not in metric:
        raise ValueError(f"{path}: 'metric' must be a namespaced metric such as 'rollout/success', got {metric!r}")
    _check_val_metric(metric, experiment, path)
    mode = raw.get("mode", "max")
    if mode not in MODES:
        raise ValueError(f"{path}: 'mode' must be one of {list(MODES)}, got {mode!r}")
    seed = raw.get("seed", 0)
    if seed is not None:
        seed = _int(seed, f"{path}: 'seed'", 0)
    name = raw.get("name") or time.strftime(f"sweep-{path.stem.replace('_', '-')}-%Y%m%d-%H%M%S")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"{path}: 'name' must match {_NAME_RE.pattern} (it names run folders), got {name!r}")
    checkpoint_at_end = raw.get("checkpoint_at_end", False)
    if not isinstance(checkpoint_at_end, bool):
        raise ValueError(f"{path}: 'checkpoint_at_end' must be true or false, got {checkpoint_at_end!r}")
    return SweepSpec(
        source=str(path), name=name, experiment=experiment, search_space=space, iterations=iterations,
        num_samples=_int(raw.get("num_samples", 1), f"{path}: 'num_samples'", 1), metric=metric, mode=mode,
        scheduler=_parse_scheduler(raw.get("scheduler"), iterations, path),
        echo_trap_stop=_parse_echo_stop(raw.get("echo_trap_stop", False), path),
        max_concurrent_trials=_int(raw.get("max_concurrent_trials", 1), f"{path}: 'max_concurrent_trials'", 1),
        resources_per_trial=_parse_resources(raw.get("resources_per_trial"), path), seed=seed,
        checkpoint_at_end=checkpoint_at_end, raw=raw)


def check_key(key: str, where: str, searchable: bool) -> None:
    """Check a dotted override key (``starpo.rollout_filter_ratio``, ``warmup.steps``, ``preset``).

    Args:
        key: the dotted key.
        where: prefix of the error message (file and section).
        searchable: True for keys that vary per trial (``SEARCHABLE``); False also allows the
            sweep-wide ``tracking.*``, ``run_dir`` and ``iterations``.

    Raises:
        ValueError: naming the key and what is allowed (with a close match when there is one).
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"{where}: keys must be dotted strings such as 'starpo.actor_lr', got {key!r}")
    head, _, leaf = key.partition(".")
    allowed = SEARCHABLE if searchable else SEARCHABLE + FIXED_ONLY
    if head not in allowed:
        extra = (f" ({head!r} is sweep-wide: set it at the top of the sweep file or in 'overrides')"
                 if head in FIXED_ONLY else "")
        raise ValueError(f"{where}: key {key!r} must start with one of {list(allowed)}{extra}")
    if head in SECTION_FIELDS:
        fields = SECTION_FIELDS[head]
        if leaf not in fields:
            close = difflib.get_close_matches(leaf, fields, n=1)
            hint = f"; did you mean '{head}.{close[0]}'?" if close else f"; known: {list(fields)}"
            raise ValueError(f"{where}: key {key!r}: {leaf!r} is not a field of '{head}'{hint}")
    elif head in OPEN_SECTIONS:
        if not leaf or "." in leaf:
            raise ValueError(f"{where}: key {key!r} must be '{head}.<name>'")
    elif leaf:
        raise ValueError(f"{where}: key {key!r}: {head!r} is a single value, not a section")


def apply_overrides(experiment: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a deep copy of ``experiment`` with each dotted key set (``starpo.lam`` -> ``cfg["starpo"]["lam"]``)."""
    cfg = copy.deepcopy(dict(experiment))
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return cfg


def absolutize(experiment: Mapping[str, Any]) -> dict[str, Any]:
    """Make ``run_dir`` and a relative local ``starpo.model`` folder absolute (Tune trials run elsewhere)."""
    cfg = copy.deepcopy(dict(experiment))
    cfg["run_dir"] = str(Path(cfg.get("run_dir") or "runs").resolve())
    starpo = cfg.get("starpo") or {}
    model = starpo.get("model")
    if isinstance(model, str) and not Path(model).is_absolute() and Path(model).exists():
        starpo["model"] = str(Path(model).resolve())
    return cfg


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
    params = build_params(cfg)
    run_dir = Path(cfg["run_dir"])
    tr = dict(cfg.get("tracking") or {})
    uri = tracking_uri or tr.get("tracking_uri") or default_tracking_uri(run_dir)
    res = {"cpu": 1.0, "gpu": 0.0, **dict(resources or {})}
    return {SETTINGS_KEY: {
        "experiment": cfg,
        "tracking_uri": uri,
        "mlflow_experiment": mlflow_experiment or tr.get("experiment") or f"ragen-{params.env.split(':')[0]}",
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
        from ragen_rllib.tracking.mlflow_logger import MLflowTracker

        settings = config.get(SETTINGS_KEY)
        if not isinstance(settings, Mapping):
            raise ValueError(f"StarPOTrainable needs config[{SETTINGS_KEY!r}] from trainable_config(...); "
                             f"got keys {sorted(config)}")
        self.overrides = {k: v for k, v in config.items() if k != SETTINGS_KEY}
        for key in self.overrides:
            check_key(key, "StarPOTrainable config", searchable=True)
        cfg = apply_overrides(settings["experiment"], self.overrides)
        params = build_params(cfg)
        self.planned_iterations = int(cfg.get("iterations", 10))
        self.run_name = f"{settings['run_prefix']}-{self.trial_id}".replace("_", "-")  # Tune ids: "1cd1b_00000"
        self.run_folder = Path(cfg["run_dir"]) / self.run_name
        self.status = "FINISHED"
        self.history: list[dict[str, float]] = []
        self.last_val: dict[str, float] = {}
        self.monitor = EchoTrapMonitor()
        self.tracker = None
        self.algo = build_config(cfg, self.run_name).build_algo()
        try:
            tags = {KIND_TAG: "trial", "ragen.trial_id": self.trial_id,
                    "ragen.trial_overrides": json.dumps(self.overrides, sort_keys=True, default=str),
                    "env": params.env, "preset": cfg.get("preset", "starpo_s"), "model": params.model,
                    "git_commit": settings.get("git_commit", "unknown"), "arrow_dir": str(self.algo.store.directory)}
            if settings.get("parent_run_id"):
                tags[PARENT_TAG] = settings["parent_run_id"]
            # A folder per trial: concurrent trials must not share one pending-records file.
            self.tracker = MLflowTracker(settings["tracking_uri"], settings["mlflow_experiment"],
                                         run_name=self.run_name, tags=tags, local_dir=self.run_folder,
                                         artifact_location=settings.get("artifact_location")).start()
            self.tracker.log_params({"starpo": params, "iterations": self.planned_iterations,
                                     "preset": cfg.get("preset", "starpo_s"), "rllib": cfg.get("rllib") or {},
                                     "warmup": cfg.get("warmup") or {}, "profile": cfg.get("profile") or "default",
                                     "source": cfg.get("source", "")})
            self.tracker.log_dict(json.loads(json.dumps(cfg, default=str)), "config/resolved.json")
            warm = cfg.get("warmup") or {}
            if warm.get("steps"):
                for s, m in enumerate(self.algo.warmup(int(warm["steps"]), warm.get("kind", "random-valid"),
                                                       groups=int(warm.get("groups", 4)),
                                                       group_size=int(warm.get("group_size", 4)))):
                    self.tracker.log_metrics({f"warmup/{k.split('/')[-1]}": v for k, v in m.items()}, step=s)
        except BaseException:
            if self.tracker is not None:
                self.tracker.end("FAILED")
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
        m = flat_metrics(self.algo.train())
        m["time/iteration"] = time.perf_counter() - t0
        for sig in self.monitor.update(m, step=i):
            print(f"[{self.run_name}] {sig.message}", flush=True)
        m.update(self.monitor.flags())
        self.tracker.log_metrics(m, step=i)
        self.history.append(m)
        self.last_val.update({k: v for k, v in m.items() if k.startswith("val/")})
        out: dict[str, Any] = {**self.last_val, **m}
        if i + 1 >= self.planned_iterations:
            out["done"] = True
            if self.algo.config.starpo.test_freq:  # final validation, as `train` (logged at step = iterations)
                final_val = self.algo.validate()
                self.tracker.log_metrics(final_val, step=i + 1)
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
        self.tracker.set_tags({"ragen.restored_from": str(path)})

    def cleanup(self) -> None:
        done = len(self.history)
        try:
            if done:
                _log_curves(self.tracker, self.history, self.run_folder)
            self.tracker.set_tags({"ragen.iterations_done": done,
                                   "ragen.stopped_early": str(done < self.planned_iterations).lower()})
        finally:
            self.tracker.end(self.status)
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
        fired = [k[len(FLAG_PREFIX):] for k, v in result.items() if k.startswith(FLAG_PREFIX) and v]
        self.log(f"[{self._label(trial)}] [{result.get('training_iteration')}/{self.iterations}] {shown}"
                 + (f" echo-trap: {','.join(fired)}" if fired else ""))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        why = ""
        if self.stopper is not None and trial.trial_id in self.stopper.stopped:
            why = f" (stopped by the Echo-Trap rule: {self.stopper.stopped[trial.trial_id]['signals']})"
        n = (trial.last_result or {}).get("training_iteration", 0)
        self.log(f"[{self._label(trial)}] finished after {n} iteration(s){why}")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.log(f"[{self._label(trial)}] FAILED: {trial.error_file or 'see the Tune log'}")


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
    import ray

    from ragen_rllib.tracking.mlflow_logger import MLflowTracker

    settings = trainable_config(spec.experiment, tracking_uri=tracking_uri, run_prefix=spec.name,
                                resources=spec.resources_per_trial)[SETTINGS_KEY]
    exp, uri, mlflow_exp = settings["experiment"], settings["tracking_uri"], settings["mlflow_experiment"]
    params = build_params(exp)
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(log_to_driver=False)
        else:
            ray.init(num_cpus=int((exp.get("rllib") or {}).get("ray_num_cpus", 2)), include_dashboard=False,
                     log_to_driver=False)
    parent = MLflowTracker(uri, mlflow_exp, run_name=spec.name, local_dir=exp["run_dir"],
                           artifact_location=settings["artifact_location"],
                           tags={KIND_TAG: "sweep", "env": params.env, "preset": exp.get("preset", "starpo_s"),
                                 "model": params.model, "git_commit": settings["git_commit"],
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
    log(table)
    if best is not None:
        log(f"best trial {best['trial_id']} ({best['overrides']}): {spec.metric} = {best['value']:.4g} "
            f"(final iteration), MLflow run {best['run_id']}")
    for trial_id, msg in errors:
        log(f"trial {trial_id} failed: {msg}")
    log(f"comparison plot: {png}")
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
def _apply_sweep_sets(raw: dict[str, Any], overrides: Sequence[str], path: Path) -> dict[str, Any]:
    import ast

    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, text = (s.strip() for s in item.split("=", 1))
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        head, _, rest = key.partition(".")
        if head not in SWEEP_KEYS:  # an experiment key: a fixed override
            head, rest = "overrides", key
        if not rest:
            raw[head] = value
        elif head in ("search_space", "overrides"):  # their keys are dotted themselves
            raw[head] = {**_mapping(raw.get(head), f"{path}: {head!r}"), rest: value}
        else:
            node = raw
            for part in [head, *rest.split(".")[:-1]]:
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            node[rest.split(".")[-1]] = value
    return raw


def _parse_domain(key: str, spec: Any, path: Path) -> tuple[str, tuple[Any, ...]]:
    where = f"{path}: search_space[{key!r}]"
    forms = "{grid: [..]}, {choice: [..]}, {uniform: [lo, hi]}, {loguniform: [lo, hi]} or {randint: [lo, hi]}"
    if not isinstance(spec, Mapping) or len(spec) != 1 or next(iter(spec)) not in SPACE_KINDS:
        raise ValueError(f"{where} must be one of {forms}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{where}: {kind} needs a non-empty list, got {values!r}")
    if kind in ("grid", "choice"):
        return kind, tuple(values)
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}: {kind} needs [lo, hi] numbers, got {values!r}")
    lo, hi = values
    if not lo < hi:
        raise ValueError(f"{where}: {kind} needs lo < hi, got {values!r}")
    if kind == "loguniform" and lo <= 0:
        raise ValueError(f"{where}: loguniform needs lo > 0, got {values!r}")
    if kind == "randint" and not (isinstance(lo, int) and isinstance(hi, int)):
        raise ValueError(f"{where}: randint needs integer [lo, hi) bounds, got {values!r}")
    return kind, (lo, hi)


def _probe_values(kind: str, values: Sequence[Any]) -> list[Any]:
    """The values checked up front: every grid/choice value, the ends of a range."""
    if kind in ("grid", "choice"):
        return list(values)
    if kind == "randint":
        return [values[0], values[1] - 1]
    return list(values)


def _check_combinations(experiment: Mapping[str, Any], space: Mapping[str, tuple[str, tuple[Any, ...]]],
                        path: Path) -> None:
    if len(space) < 2 or any(kind not in ("grid", "choice") for kind, _ in space.values()):
        return
    keys = list(space)
    combos = itertools.product(*(space[k][1] for k in keys))
    for combo in itertools.islice(combos, MAX_CHECKED_COMBINATIONS):
        point = dict(zip(keys, combo, strict=False))
        _check_trial(experiment, point, f"{path}: search_space combination {point}")


def _check_trial(experiment: Mapping[str, Any], overrides: Mapping[str, Any], where: str) -> None:
    cfg = apply_overrides(experiment, overrides)
    try:
        build_params(cfg)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{where} is invalid: {e}") from None
    warm = cfg.get("warmup") or {}
    if warm:
        if warm.get("kind", "random-valid") not in DEMO_KINDS:
            raise ValueError(f"{where} is invalid: warmup.kind must be one of {list(DEMO_KINDS)}, got {warm['kind']!r}")
        for k in ("steps", "groups", "group_size"):
            v = warm.get(k, 0 if k == "steps" else 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "steps" else 1):
                raise ValueError(f"{where} is invalid: warmup.{k} must be an int >= {0 if k == 'steps' else 1}, "
                                 f"got {v!r}")


def _check_val_metric(metric: str, experiment: Mapping[str, Any], path: Path) -> None:
    """A ``val/<env>/...`` metric needs validation at iteration 0 and every ``test_freq`` after, on that env."""
    if not metric.startswith("val/"):
        return
    p = build_params(experiment)
    if not p.test_freq or not p.val_before_train:
        raise ValueError(f"{path}: metric {metric!r} needs validation from the first iteration on (Tune wants it in "
                         f"every result): set starpo.test_freq >= 1 and starpo.val_before_train: true, got "
                         f"test_freq={p.test_freq}, val_before_train={p.val_before_train}")
    envs = p.val_envs or (p.env,)
    env = metric.split("/")[1] if metric.count("/") >= 2 else ""
    if env not in envs:
        raise ValueError(f"{path}: metric {metric!r}: validation env {env!r} is not validated; "
                         f"val metrics here: {[f'val/{e}/success' for e in envs]}")


def _parse_scheduler(value: Any, iterations: int, path: Path) -> SchedulerSpec:
    if value is None or value == "fifo":
        return SchedulerSpec()
    if value == "asha":
        value = {"type": "asha"}
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: 'scheduler' must be null, 'fifo', 'asha' or a mapping with 'type', got {value!r}")
    unknown = sorted(set(value) - {"type", "grace_period", "reduction_factor"})
    if unknown:
        raise ValueError(f"{path}: scheduler: unknown key(s) {unknown}; known: ['type', 'grace_period', "
                         "'reduction_factor']")
    kind = value.get("type", "fifo")
    if kind not in SCHEDULERS:
        raise ValueError(f"{path}: scheduler.type must be one of {list(SCHEDULERS)}, got {kind!r}")
    if kind == "fifo":
        if set(value) - {"type"}:
            raise ValueError(f"{path}: scheduler: {sorted(set(value) - {'type'})} only apply to type 'asha'")
        return SchedulerSpec()
    grace = _int(value.get("grace_period", 1), f"{path}: scheduler.grace_period", 1)
    if grace > iterations:
        raise ValueError(f"{path}: scheduler.grace_period must be <= iterations ({iterations}), got {grace}")
    rf = value.get("reduction_factor", 2)
    if isinstance(rf, bool) or not isinstance(rf, (int, float)) or rf <= 1:
        raise ValueError(f"{path}: scheduler.reduction_factor must be a number > 1, got {rf!r}")
    return SchedulerSpec("asha", grace, float(rf))


def _parse_echo_stop(value: Any, path: Path) -> EchoTrapStop | None:
    if value is None or value is False:
        return None
    if value is True:
        return EchoTrapStop()
    if not isinstance(value, Mapping):
        raise ValueError(f"{path}: 'echo_trap_stop' must be true, false or {{patience: int, signals: [...]}}, "
                         f"got {value!r}")
    unknown = sorted(set(value) - {"patience", "signals"})
    if unknown:
        raise ValueError(f"{path}: echo_trap_stop: unknown key(s) {unknown}; known: ['patience', 'signals']")
    patience = _int(value.get("patience", 2), f"{path}: echo_trap_stop.patience", 1)
    signals = value.get("signals", list(DEFAULT_STOP_SIGNALS))
    if not isinstance(signals, (list, tuple)) or not signals or set(signals) - set(SIGNALS):
        raise ValueError(f"{path}: echo_trap_stop.signals must be a non-empty list from {list(SIGNALS)}, "
                         f"got {signals!r}")
    return EchoTrapStop(patience, tuple(signals))


def _parse_resources(value: Any, path: Path) -> dict[str, float]:
    value = _mapping(value, f"{path}: 'resources_per_trial'")
    unknown = sorted(set(value) - {"cpu", "gpu"})
    if unknown:
        raise ValueError(f"{path}: resources_per_trial: unknown key(s) {unknown}; known: ['cpu', 'gpu']")
    out = {"cpu": value.get("cpu", 1), "gpu": value.get("gpu", 0)}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (k == "cpu" and v == 0):
            raise ValueError(f"{path}: resources_per_trial.{k} must be a number {'> 0' if k == 'cpu' else '>= 0'}, "
                             f"got {v!r}")
    return {k: float(v) for k, v in out.items()}


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a mapping, got {value!r}")
    return dict(value)


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where} must be an int >= {minimum}, got {value!r}")
    return value
