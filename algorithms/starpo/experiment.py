"""The experiment: one typed, frozen description of a run, with one loader and one override parser.

Used by ``train``, ``eval``, ``sweep``, ``submit`` and ``--resume``. Ray-free (yaml + the params).

Experiment file layout (``experiments/*.yaml``)::

    preset: starpo_s            # starpo | starpo_s
    iterations: 200
    checkpoint_freq: 1          # iterations between checkpoints (0: only at the end)
    run_dir: runs
    starpo: {env: sokoban, ...}  # StarPOParams overrides (RAGEN names)
    warmup: {steps: 20, kind: random-valid, groups: 4, group_size: 4}
    rllib: {num_env_runners: 0, num_learners: 0, ray_num_cpus: 2}
    tracking: {experiment: ragen-sokoban, tracking_uri: null, log_model: true, register_model: true}
    profiles:                   # named overlays, e.g. a small CPU profile
      cpu: {iterations: 20, starpo: {...}}

``--set key=value`` sets any leaf (``starpo.actor_lr=1e-5``, ``iterations=5``); values are Python
literals, else strings. Every key is checked: an unknown one fails with its nearest match.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ragen_rllib.algorithms.starpo.params import PRESETS, StarPOParams
from ragen_rllib.envs.demos import DEMO_KINDS
from ragen_rllib.envs.registry import make_env_config
from ragen_rllib.errors import ConfigError


@dataclass(frozen=True)
class Warmup:
    """The supervised format warm-up before RL (0 steps: none).

    Attributes:
        steps: SFT steps (int >= 0). kind: demonstration policy (``envs/demos.py``).
        groups, group_size: demonstration rollouts per step (P initial states x N samples, ints >= 1).
        lr: the actor's learning rate during the warm-up (float > 0, per optimizer step); None: the
            RL rate ``starpo.actor_lr``. SFT usually wants a larger rate than RL; RL's schedule
            takes over again at its first update.
    """

    steps: int = 0
    kind: str = "random-valid"
    groups: int = 4
    group_size: int = 4
    lr: float | None = None

    def duplicate_demos_note(self) -> str | None:
        """A one-line note when the demonstrations repeat: the expert acts deterministically, so the
        ``group_size`` samples of a group (one initial state) get the same demonstration (up to slips
        on the slippery lake)."""
        if self.steps and self.kind == "expert" and self.group_size > 1:
            return (f"warm-up: the expert is deterministic, so warmup.group_size={self.group_size} repeats each "
                    f"demonstration {self.group_size} times ({self.steps * self.groups} distinct initial states "
                    f"in {self.steps} steps); warmup.groups={self.groups * self.group_size} "
                    f"warmup.group_size=1 shows as many rows, all distinct")
        return None


@dataclass(frozen=True)
class Tracking:
    """MLflow: ``experiment`` (default ``ragen-<env>``), ``tracking_uri`` (default a SQLite file in
    the run folder), ``log_model`` (log the final model folder as an artifact), ``register_model``
    (register it in the Model Registry under the experiment's name, as a new version)."""

    experiment: str | None = None
    tracking_uri: str | None = None
    log_model: bool = True
    register_model: bool = True


@dataclass(frozen=True)
class Resources:
    """RLlib resources (``rllib:``): remote env runners and learners (0: in the driver), their CPUs
    and GPUs, and ``ray_num_cpus`` for a local ``ray.init``."""

    num_env_runners: int = 0
    num_cpus_per_env_runner: float = 1
    num_gpus_per_env_runner: float = 0
    custom_resources_per_env_runner: Mapping[str, float] = field(default_factory=dict)
    num_learners: int = 0
    num_cpus_per_learner: float | str = "auto"
    num_gpus_per_learner: float = 0
    ray_num_cpus: int = 2


#: Leaf names allowed under each section of an experiment (a dotted key's second part).
SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "starpo": tuple(f.name for f in dataclasses.fields(StarPOParams)),
    "warmup": tuple(f.name for f in dataclasses.fields(Warmup)),
    "tracking": tuple(f.name for f in dataclasses.fields(Tracking)),
    "rllib": tuple(f.name for f in dataclasses.fields(Resources)),
}
#: Top-level single values of an experiment.
SCALAR_KEYS = ("preset", "iterations", "checkpoint_freq", "run_dir", "run_name")
#: Written by the loader (where the config came from), not by users.
PROVENANCE_KEYS = ("source", "profile")
# A run name is the Arrow store's run id and a folder name (trajectory/store.py accepts these).
_RUN_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.\-]*")


@dataclass(frozen=True)
class Experiment:
    """A whole run: the algorithm's params and everything around them (validated on creation).

    Attributes:
        starpo: the algorithm's hyperparameters (preset + ``starpo:`` section, validated).
        preset: ``starpo`` or ``starpo_s``. iterations: RL iterations (>= 0).
        checkpoint_freq: iterations between checkpoints (>= 0; 0: only the final one).
        run_dir: folder of run folders. run_name: this run's folder name (None: a timestamp).
        warmup, tracking, rllib: see their classes.
        source, profile: the file and profile the experiment was loaded from ("" / None if built).
        config: the resolved experiment as a plain dict (what is logged, and what ``--resume`` reads).
    """

    starpo: StarPOParams
    preset: str = "starpo_s"
    iterations: int = 10
    checkpoint_freq: int = 1
    run_dir: str = "runs"
    run_name: str | None = None
    warmup: Warmup = field(default_factory=Warmup)
    tracking: Tracking = field(default_factory=Tracking)
    rllib: Resources = field(default_factory=Resources)
    source: str = ""
    profile: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def mlflow_experiment(self) -> str:
        """The MLflow experiment: ``tracking.experiment``, else ``ragen-<env>``."""
        return self.tracking.experiment or f"ragen-{self.starpo.env.split(':')[0]}"

    @classmethod
    def load(cls, path: str | Path, profile: str | None = None, sets: Sequence[str] = ()) -> Experiment:
        """Read an experiment file, overlay ``profile``, apply ``key=value`` ``sets``, validate.

        Raises:
            FileNotFoundError: missing file. ConfigError (a ValueError): ``<file>:<line>: ...`` for
            malformed YAML, else naming the file, key and value (unknown profile, key, env, bad value).
        """
        return cls.from_dict(load_experiment(path, profile, sets))

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> Experiment:
        """Validate a resolved experiment dict (as ``load_experiment`` returns).

        Every key, value, env name, variant and env field is checked here, before anything starts.

        Raises:
            ConfigError: one line naming the file (``source``), the key and the bad value.
        """
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"an experiment must be a mapping of key: value, got {type(cfg).__name__}")
        where = str(cfg.get("source") or "experiment")
        check_keys(cfg, where)
        iterations = _int(cfg.get("iterations", 10), f"{where}: iterations", 0)
        checkpoint_freq = _int(cfg.get("checkpoint_freq", 1), f"{where}: checkpoint_freq", 0)
        preset = _preset(cfg.get("preset", "starpo_s"), where)
        run_dir = cfg.get("run_dir") or "runs"
        if not isinstance(run_dir, str):
            raise ConfigError(f"{where}: run_dir must be a folder path, got {run_dir!r}")
        run_name = cfg.get("run_name")
        if isinstance(run_name, int) and not isinstance(run_name, bool):
            run_name = str(run_name)
        if run_name is not None and not (isinstance(run_name, str) and _RUN_NAME_RE.fullmatch(run_name)):
            raise ConfigError(f"{where}: run_name must match {_RUN_NAME_RE.pattern} (it names the run folder), "
                              f"got {run_name!r}")
        try:
            starpo = build_params({**cfg, "preset": preset, "iterations": iterations})
        except ValueError as e:  # named as the file spells it: starpo.<field>
            raise ConfigError(f"{where}: {str(e).replace('StarPOParams.', 'starpo.', 1)}") from None
        check_envs(starpo, where)
        return cls(starpo=starpo, preset=preset, iterations=iterations, checkpoint_freq=checkpoint_freq,
                   run_dir=run_dir, run_name=run_name,
                   warmup=_section(Warmup, cfg, "warmup", str(where)),
                   tracking=_section(Tracking, cfg, "tracking", str(where)),
                   rllib=_section(Resources, cfg, "rllib", str(where)),
                   source=str(cfg.get("source") or ""), profile=cfg.get("profile"),
                   config=copy.deepcopy(dict(cfg)))


# ------------------------------------------------------------------------------ loading
def load_experiment(path: str | Path, profile: str | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read an experiment YAML, apply a profile and ``key=value`` overrides; returns the plain dict.

    Raises:
        FileNotFoundError: missing file. ConfigError (a ValueError): malformed YAML
        (``<file>:<line>: ...``), unknown profile, bad override, bad preset.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"experiment config {str(path)!r} does not exist")
    cfg = read_yaml(path)
    profiles = cfg.pop("profiles", {}) or {}
    if not isinstance(profiles, Mapping):
        raise ConfigError(f"{path}: 'profiles' must map profile names to overlays, got {profiles!r}")
    if profile:
        if profile not in profiles:
            raise ConfigError(f"{path}: unknown profile {profile!r}; profiles: {sorted(map(str, profiles))}")
        overlay = profiles[profile] or {}
        if not isinstance(overlay, Mapping):
            raise ConfigError(f"{path}: profile {profile!r} must be a mapping of key: value, got {overlay!r}")
        cfg = merge(cfg, overlay)
    set_dotted(cfg, parse_sets(overrides), where=f"{path}: --set")
    _preset(cfg.get("preset", "starpo_s"), str(path))
    cfg["source"] = str(path)
    cfg["profile"] = profile
    return cfg


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping from ``path``; a syntax error is one line ``<file>:<line>:<col>: <problem>``."""
    try:
        data = yaml.safe_load(path.read_text())
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); is it the experiment YAML?") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = " ".join((getattr(e, "problem", None) or str(e)).split())
        raise ConfigError(f"{at}: malformed YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must hold a mapping (key: value lines), got {type(data).__name__}")
    return data


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in ``over`` replaces."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}``: values as Python literals, else strings.

    The one ``key=value`` parser of the command line (``train``, ``eval``, ``sweep``, ``submit``,
    ``rollout``, ``--resume``). YAML's ``true``, ``false`` and ``null`` mean True, False and None,
    as they do in the experiment files.

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        raw = raw.strip()
        if raw in _YAML_WORDS:
            value = _YAML_WORDS[raw]
        else:
            try:
                value = ast.literal_eval(raw)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                value = raw
        out[key.strip()] = value
    return out


_YAML_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None}


def set_dotted(cfg: dict[str, Any], values: Mapping[str, Any], where: str = "--set") -> dict[str, Any]:
    """Set each dotted key of ``values`` in ``cfg`` in place (``starpo.lam`` -> ``cfg["starpo"]["lam"]``).

    Keys are checked with ``check_key`` first. Returns ``cfg``.
    """
    for key, value in values.items():
        check_key(key, where)
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return cfg


def with_overrides(cfg: Mapping[str, Any], values: Mapping[str, Any], where: str = "override") -> dict[str, Any]:
    """A deep copy of ``cfg`` with the dotted ``values`` set (see ``set_dotted``)."""
    return set_dotted(copy.deepcopy(dict(cfg)), values, where)


def check_key(key: str, where: str) -> None:
    """Check a dotted experiment key: ``preset``, ``iterations``, ``starpo.<field>``, ``warmup.<field>``, ...

    Raises:
        ConfigError: naming the key and what is allowed (with the nearest match when there is one).
    """
    if not isinstance(key, str) or not key:
        raise ConfigError(f"{where}: keys must be dotted strings such as 'starpo.actor_lr', got {key!r}")
    head, _, leaf = key.partition(".")
    if head in SECTION_FIELDS:
        fields = SECTION_FIELDS[head]
        if leaf not in fields:
            close = difflib.get_close_matches(leaf, fields, n=1)
            hint = f"; did you mean '{head}.{close[0]}'?" if close else f"; known: {list(fields)}"
            if not leaf:  # `--set starpo=3`: a section, not a value
                hint = f"; '{head}' is a section: set one of its fields, e.g. '{head}.{fields[0]}=...'"
            raise ConfigError(f"{where}: key {key!r}: {leaf!r} is not a field of '{head}'{hint}")
        return
    known = list(SCALAR_KEYS) + list(SECTION_FIELDS)
    if head not in SCALAR_KEYS + PROVENANCE_KEYS:
        close = difflib.get_close_matches(head, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where}: unknown key {key!r}; an experiment has {known}{hint}")
    if leaf:
        raise ConfigError(f"{where}: key {key!r}: {head!r} is a single value, not a section")


def check_keys(cfg: Mapping[str, Any], where: str) -> None:
    """Every key of a resolved experiment dict is known (``check_key`` on each leaf)."""
    for head, value in cfg.items():
        if head in SECTION_FIELDS:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: {head!r} must be a mapping of {head}.<field>: value, got {value!r}")
            for leaf in value:
                check_key(f"{head}.{leaf}", where)
        else:
            check_key(str(head), where)


def build_params(cfg: Mapping[str, Any]) -> StarPOParams:
    """StarPOParams from the preset + the ``starpo`` section (validated; errors name the field).

    Raises:
        ConfigError: a bad preset or field value (``StarPOParams.validate``).
    """
    overrides = dict(cfg.get("starpo") or {})
    for name in ("val_envs", "lora_target_modules"):  # YAML lists (or one name) -> the tuple fields
        if name in overrides:
            value = overrides[name]
            overrides[name] = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else value
    iterations = cfg.get("iterations", 0) or 0
    if isinstance(iterations, int) and not isinstance(iterations, bool):  # else from_dict names the bad value
        overrides.setdefault("total_training_steps", iterations)  # the LR schedule's horizon
    return PRESETS[_preset(cfg.get("preset", "starpo_s"), "experiment")](**overrides)


def check_envs(p: StarPOParams, where: str) -> None:
    """The train env, every validation env and ``env_config`` exist and fit (no env is built).

    Raises:
        ConfigError: naming the key (``starpo.env``, ``starpo.val_envs``, ``starpo.env_config``).
    """
    for key, spec in [("starpo.env", p.env)] + [("starpo.val_envs", v) for v in p.val_envs]:
        try:
            make_env_config(spec)
        except (KeyError, ImportError) as e:
            raise ConfigError(f"{where}: {key}: {e.args[0] if e.args else e} (see `ragen-rllib envs`)") from None
        try:
            make_env_config(spec, **p.env_config)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: starpo.env_config for {spec!r}: {e}") from None


def _preset(value: Any, where: str) -> str:
    if not isinstance(value, str) or value not in PRESETS:
        raise ConfigError(f"{where}: preset must be one of {sorted(PRESETS)}, got {value!r}")
    return value


def _count(v: Any) -> bool:
    """An int >= 0 (not a bool)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _amount(v: Any) -> bool:
    """A number >= 0 (not a bool)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0


#: What each annotation of ``Warmup``, ``Tracking`` and ``Resources`` allows, and how to say it.
_SECTION_TYPES: dict[str, tuple[Any, str]] = {
    "int": (_count, "an int >= 0"),
    "int | None": (lambda v: v is None or _count(v), "an int >= 0 or null"),
    "float": (_amount, "a number >= 0"),
    "float | None": (lambda v: v is None or _amount(v), "a number >= 0 or null"),
    "float | str": (lambda v: v == "auto" or _amount(v), "a number >= 0 or 'auto'"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "str | None": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "Mapping[str, float]": (lambda v: isinstance(v, Mapping) and all(isinstance(k, str) and _amount(x)
                                                                     for k, x in v.items()),
                            "a mapping of resource name: amount >= 0"),
}


def _section(cls: type, cfg: Mapping[str, Any], name: str, where: str) -> Any:
    values = dict(cfg.get(name) or {})
    try:
        obj = cls(**values)
    except TypeError as e:  # unknown field (check_keys catches it first) or a bad constructor call
        raise ConfigError(f"{where}: {name}: {e}") from None
    for f in dataclasses.fields(cls):
        value = getattr(obj, f.name)
        if str(f.type) not in _SECTION_TYPES:  # a new field's annotation: teach the table its check
            raise TypeError(f"{cls.__name__}.{f.name}: no check for annotation {f.type!r} in _SECTION_TYPES")
        check, what = _SECTION_TYPES[str(f.type)]
        if not check(value):
            raise ConfigError(f"{where}: {name}.{f.name} must be {what}, got {value!r}")
    if cls is Warmup:
        if obj.kind not in DEMO_KINDS:
            raise ConfigError(f"{where}: warmup.kind must be one of {list(DEMO_KINDS)}, got {obj.kind!r}")
        for k in ("groups", "group_size"):
            if getattr(obj, k) < 1:
                raise ConfigError(f"{where}: warmup.{k} must be an int >= 1, got {getattr(obj, k)!r}")
        if obj.lr is not None and not obj.lr > 0:
            raise ConfigError(f"{where}: warmup.lr must be a number > 0 or null (starpo.actor_lr), got {obj.lr!r}")
    if cls is Resources and obj.ray_num_cpus < 1:
        raise ConfigError(f"{where}: rllib.ray_num_cpus must be an int >= 1, got {obj.ray_num_cpus!r}")
    return obj


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where} must be an int >= {minimum}, got {value!r}")
    return value
