"""Sweep files: parsing and validation, without Ray (``ragen-rllib sweep`` runs them, ``sweep.py``).

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

Every dotted key is an experiment key (``experiment.check_key``); ``tracking.*``, ``run_dir`` and
``iterations`` are sweep-wide (not searchable). Errors name the file, the key and the bad value.
"""

from __future__ import annotations

import copy
import itertools
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from ragen_rllib.algorithms.starpo.experiment import (
    Experiment,
    build_params,
    load_experiment,
    parse_sets,
    read_yaml,
    with_overrides,
)
from ragen_rllib.algorithms.starpo.experiment import check_key as check_experiment_key
from ragen_rllib.errors import ConfigError
from ragen_rllib.tracking.compare import MODES
from ragen_rllib.tracking.echo_trap import ENTROPY_COLLAPSE, GRAD_NORM_SPIKE, SIGNALS, STD_COLLAPSE

SWEEP_KEYS = ("base", "profile", "iterations", "overrides", "search_space", "num_samples", "metric", "mode",
              "scheduler", "echo_trap_stop", "max_concurrent_trials", "resources_per_trial", "seed", "name",
              "checkpoint_at_end")
SPACE_KINDS = ("grid", "choice", "uniform", "loguniform", "randint")
SCHEDULERS = ("fifo", "asha")
#: Echo-Trap signals watched by ``EchoTrapStopper`` unless told otherwise (see ``sweep.py``).
DEFAULT_STOP_SIGNALS = (STD_COLLAPSE, ENTROPY_COLLAPSE, GRAD_NORM_SPIKE)
#: Keys that may vary per trial; ``tracking.*``, ``run_dir`` and ``iterations`` are sweep-wide.
SEARCHABLE = ("preset", "starpo", "warmup", "rllib")
FIXED_ONLY = ("tracking", "run_dir", "iterations")
#: Purely discrete search spaces up to this many combinations are validated point by point up front.
MAX_CHECKED_COMBINATIONS = 512
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
        ConfigError (a ValueError): anything invalid; the message names the file, the key and the bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"sweep config {str(path)!r} does not exist")
    raw = read_yaml(path)  # `<file>:<line>: ...` for malformed YAML
    raw = _apply_sweep_sets(copy.deepcopy(raw), overrides, path)
    unknown = sorted(map(str, set(raw) - set(SWEEP_KEYS)))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; a sweep file has {list(SWEEP_KEYS)}")
    base = raw.get("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: 'base' must name the experiment file (relative to the sweep file), got {base!r}")
    base_path = Path(base) if Path(base).is_absolute() else path.parent / base
    if not base_path.is_file():
        raise FileNotFoundError(f"{path}: base experiment {str(base_path)!r} does not exist")
    profile = raw.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise ConfigError(f"{path}: 'profile' must be a profile name or null, got {profile!r}")
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
        raise ConfigError(f"{path}: 'search_space' must map at least one dotted key to e.g. {{grid: [...]}}")
    space: dict[str, tuple[str, tuple[Any, ...]]] = {}
    for key, spec in space_raw.items():
        check_key(key, f"{path}: search_space", searchable=True)
        if key in fixed:
            raise ConfigError(f"{path}: {key!r} is both a fixed override and in search_space; keep one")
        space[key] = _parse_domain(key, spec, path)
        for value in _probe_values(*space[key]):
            _check_trial(experiment, {key: value}, f"{path}: search_space[{key!r}] value {value!r}")
    _check_combinations(experiment, space, path)

    metric = raw.get("metric", "rollout/success")
    if not isinstance(metric, str) or "/" not in metric:
        raise ConfigError(f"{path}: 'metric' must be a namespaced metric such as 'rollout/success', got {metric!r}")
    _check_val_metric(metric, experiment, path)
    mode = raw.get("mode", "max")
    if mode not in MODES:
        raise ConfigError(f"{path}: 'mode' must be one of {list(MODES)}, got {mode!r}")
    seed = raw.get("seed", 0)
    if seed is not None:
        seed = _int(seed, f"{path}: 'seed'", 0)
    name = raw.get("name") or time.strftime(f"sweep-{path.stem.replace('_', '-')}-%Y%m%d-%H%M%S")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{path}: 'name' must match {_NAME_RE.pattern} (it names run folders), got {name!r}")
    checkpoint_at_end = raw.get("checkpoint_at_end", False)
    if not isinstance(checkpoint_at_end, bool):
        raise ConfigError(f"{path}: 'checkpoint_at_end' must be true or false, got {checkpoint_at_end!r}")
    return SweepSpec(
        source=str(path), name=name, experiment=experiment, search_space=space, iterations=iterations,
        num_samples=_int(raw.get("num_samples", 1), f"{path}: 'num_samples'", 1), metric=metric, mode=mode,
        scheduler=_parse_scheduler(raw.get("scheduler"), iterations, path),
        echo_trap_stop=_parse_echo_stop(raw.get("echo_trap_stop", False), path),
        max_concurrent_trials=_int(raw.get("max_concurrent_trials", 1), f"{path}: 'max_concurrent_trials'", 1),
        resources_per_trial=_parse_resources(raw.get("resources_per_trial"), path), seed=seed,
        checkpoint_at_end=checkpoint_at_end, raw=raw)


def check_key(key: str, where: str, searchable: bool) -> None:
    """Check a dotted override key of a sweep (``starpo.rollout_filter_ratio``, ``warmup.steps``, ``preset``).

    Args:
        key: the dotted key.
        where: prefix of the error message (file and section).
        searchable: True for keys that vary per trial (``SEARCHABLE``); False also allows the
            sweep-wide ``tracking.*``, ``run_dir`` and ``iterations``.

    Raises:
        ConfigError: naming the key and what is allowed (with a close match when there is one).
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}: keys must be dotted strings such as 'starpo.actor_lr', got {key!r}")
    head = key.partition(".")[0]
    allowed = SEARCHABLE if searchable else SEARCHABLE + FIXED_ONLY
    if head not in allowed:
        extra = (f" ({head!r} is sweep-wide: set it at the top of the sweep file or in 'overrides')"
                 if head in FIXED_ONLY else "")
        raise ConfigError(f"{where}: key {key!r} must start with one of {list(allowed)}{extra}")
    check_experiment_key(key, where)


def apply_overrides(experiment: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a deep copy of ``experiment`` with each dotted key set (``starpo.lam`` -> ``cfg["starpo"]["lam"]``)."""
    return with_overrides(experiment, overrides)


def absolutize(experiment: Mapping[str, Any]) -> dict[str, Any]:
    """Make ``run_dir`` and a relative local ``starpo.model`` folder absolute (Tune trials run elsewhere)."""
    cfg = copy.deepcopy(dict(experiment))
    run_dir = cfg.get("run_dir") or "runs"
    if isinstance(run_dir, str):  # anything else is refused by the trial check that follows
        cfg["run_dir"] = str(Path(run_dir).resolve())
    starpo = cfg.get("starpo") or {}
    model = starpo.get("model") if isinstance(starpo, dict) else None
    if isinstance(model, str) and not Path(model).is_absolute() and Path(model).exists():
        starpo["model"] = str(Path(model).resolve())
    return cfg


def _apply_sweep_sets(raw: dict[str, Any], overrides: Sequence[str], path: Path) -> dict[str, Any]:
    for key, value in parse_sets(overrides).items():
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
        raise ConfigError(f"{where} must be one of {forms}, got {spec!r}")
    kind, values = next(iter(spec.items()))
    if not isinstance(values, (list, tuple)) or not values:
        raise ConfigError(f"{where}: {kind} needs a non-empty list, got {values!r}")
    if kind in ("grid", "choice"):
        return kind, tuple(values)
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{where}: {kind} needs [lo, hi] numbers, got {values!r}")
    lo, hi = values
    if not lo < hi:
        raise ConfigError(f"{where}: {kind} needs lo < hi, got {values!r}")
    if kind == "loguniform" and lo <= 0:
        raise ConfigError(f"{where}: loguniform needs lo > 0, got {values!r}")
    if kind == "randint" and not (isinstance(lo, int) and isinstance(hi, int)):
        raise ConfigError(f"{where}: randint needs integer [lo, hi) bounds, got {values!r}")
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
    try:
        Experiment.from_dict(apply_overrides(experiment, overrides))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where} is invalid: {e}") from None


def _check_val_metric(metric: str, experiment: Mapping[str, Any], path: Path) -> None:
    """A ``val/<env>/...`` metric needs validation at iteration 0 and every ``test_freq`` after, on that env."""
    if not metric.startswith("val/"):
        return
    p = build_params(experiment)
    if not p.test_freq or not p.val_before_train:
        raise ConfigError(f"{path}: metric {metric!r} needs validation from the first iteration on (Tune wants it in "
                          f"every result): set starpo.test_freq >= 1 and starpo.val_before_train: true, got "
                          f"test_freq={p.test_freq}, val_before_train={p.val_before_train}")
    envs = p.val_envs or (p.env,)
    env = metric.split("/")[1] if metric.count("/") >= 2 else ""
    if env not in envs:
        raise ConfigError(f"{path}: metric {metric!r}: validation env {env!r} is not validated; "
                          f"val metrics here: {[f'val/{e}/success' for e in envs]}")


def _parse_scheduler(value: Any, iterations: int, path: Path) -> SchedulerSpec:
    if value is None or value == "fifo":
        return SchedulerSpec()
    if value == "asha":
        value = {"type": "asha"}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: 'scheduler' must be null, 'fifo', 'asha' or a mapping with 'type', got {value!r}")
    unknown = sorted(map(str, set(value) - {"type", "grace_period", "reduction_factor"}))
    if unknown:
        raise ConfigError(f"{path}: scheduler: unknown key(s) {unknown}; known: ['type', 'grace_period', "
                          "'reduction_factor']")
    kind = value.get("type", "fifo")
    if kind not in SCHEDULERS:
        raise ConfigError(f"{path}: scheduler.type must be one of {list(SCHEDULERS)}, got {kind!r}")
    if kind == "fifo":
        if set(value) - {"type"}:
            raise ConfigError(f"{path}: scheduler: {sorted(map(str, set(value) - {'type'}))} only apply to type "
                              "'asha'")
        return SchedulerSpec()
    grace = _int(value.get("grace_period", 1), f"{path}: scheduler.grace_period", 1)
    if grace > iterations:
        raise ConfigError(f"{path}: scheduler.grace_period must be <= iterations ({iterations}), got {grace}")
    rf = value.get("reduction_factor", 2)
    if isinstance(rf, bool) or not isinstance(rf, (int, float)) or rf <= 1:
        raise ConfigError(f"{path}: scheduler.reduction_factor must be a number > 1, got {rf!r}")
    return SchedulerSpec("asha", grace, float(rf))


def _parse_echo_stop(value: Any, path: Path) -> EchoTrapStop | None:
    if value is None or value is False:
        return None
    if value is True:
        return EchoTrapStop()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path}: 'echo_trap_stop' must be true, false or {{patience: int, signals: [...]}}, "
                          f"got {value!r}")
    unknown = sorted(map(str, set(value) - {"patience", "signals"}))
    if unknown:
        raise ConfigError(f"{path}: echo_trap_stop: unknown key(s) {unknown}; known: ['patience', 'signals']")
    patience = _int(value.get("patience", 2), f"{path}: echo_trap_stop.patience", 1)
    signals = value.get("signals", list(DEFAULT_STOP_SIGNALS))
    if (not isinstance(signals, (list, tuple)) or not signals or not all(isinstance(x, str) for x in signals)
            or set(signals) - set(SIGNALS)):
        raise ConfigError(f"{path}: echo_trap_stop.signals must be a non-empty list from {list(SIGNALS)}, "
                          f"got {signals!r}")
    return EchoTrapStop(patience, tuple(signals))


def _parse_resources(value: Any, path: Path) -> dict[str, float]:
    value = _mapping(value, f"{path}: 'resources_per_trial'")
    unknown = sorted(map(str, set(value) - {"cpu", "gpu"}))
    if unknown:
        raise ConfigError(f"{path}: resources_per_trial: unknown key(s) {unknown}; known: ['cpu', 'gpu']")
    out = {"cpu": value.get("cpu", 1), "gpu": value.get("gpu", 0)}
    for k, v in out.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (k == "cpu" and v == 0):
            raise ConfigError(f"{path}: resources_per_trial.{k} must be a number {'> 0' if k == 'cpu' else '>= 0'}, "
                              f"got {v!r}")
    return {k: float(v) for k, v in out.items()}


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a mapping, got {value!r}")
    return dict(value)


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where} must be an int >= {minimum}, got {value!r}")
    return value
