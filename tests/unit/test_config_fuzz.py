"""Config fuzz: seeded mutations of every shipped experiment and sweep file either load, or fail
with the project's one-line error (``ConfigError``, or ``FileNotFoundError`` for a missing file)
that names the file. Never another exception.

The loaders are the ones ``train`` / ``eval`` / ``submit`` (``Experiment.load``) and ``sweep``
(``load_sweep``) use; nothing heavy starts (no Ray, no engine, no model files read).
"""

from __future__ import annotations

import copy
import functools
import random
import zlib
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from ragen_rllib.algorithms.starpo.experiment import Experiment
from ragen_rllib.algorithms.starpo.sweep_spec import load_sweep
from ragen_rllib.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
SWEEPS = sorted((ROOT / "experiments" / "sweeps").glob("*.yaml"))
MUTATIONS_PER_FILE = 30

#: Values that replace a random leaf: wrong types, negative and empty values, nothing.
BAD_VALUES: tuple[Any, ...] = ("abc", "", -1, -0.5, 0, 1e9, None, True, [1, 2], {"x": 1}, "1e-6", [], {})
#: Lines that are not YAML (or not the YAML the loader wants), inserted at a random line.
BAD_LINES = ("  : - ]", "\tstarpo: {", "[unclosed", "key: {a: 1", "- just a list item", "? [a, b]\n: c",
             "starpo: *nowhere", "%YAML 9.9", "iterations: 1: 2", "'unterminated")


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path into nested dicts and lists (for deleting, renaming, replacing)."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out += _paths(v, prefix + (i,))
    return out


def _parent(tree: Any, path: tuple) -> Any:
    for part in path[:-1]:
        tree = tree[part]
    return tree


def _mutate_tree(tree: dict, rng: random.Random) -> tuple[str, str]:
    """Apply one structural mutation in place; returns (what was done, the YAML text)."""
    paths = _paths(tree)
    path = rng.choice(paths)
    parent, last = _parent(tree, path), path[-1]
    op = rng.choice(("delete", "rename", "replace", "replace", "replace"))
    if op == "delete":
        del parent[last]
    elif op == "rename" and isinstance(parent, dict):
        value = parent.pop(last)
        name = str(last)
        typo = rng.choice((name[:-1], name + "x", name.upper(), name.replace("_", ""), name + ".x"))
        parent[typo or "x"] = value
        op = f"rename to {typo!r}"
    else:
        value = rng.choice(BAD_VALUES)
        parent[last] = copy.deepcopy(value)
        op = f"replace by {value!r}"
    return f"{op} at {'.'.join(map(str, path))}", yaml.safe_dump(tree, sort_keys=False)


def _mutate_text(text: str, rng: random.Random) -> tuple[str, str]:
    if rng.random() < 0.5:
        cut = rng.randrange(len(text))
        return f"truncate at {cut}", text[:cut]
    lines = text.splitlines()
    at = rng.randrange(len(lines) + 1)
    bad = rng.choice(BAD_LINES)
    return f"insert {bad!r} at line {at + 1}", "\n".join(lines[:at] + [bad] + lines[at:]) + "\n"


def _mutations(text: str, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    tree = yaml.safe_load(text)
    out = []
    for _ in range(MUTATIONS_PER_FILE):
        if rng.random() < 0.7:
            out.append(_mutate_tree(copy.deepcopy(tree), rng))
        else:
            out.append(_mutate_text(text, rng))
    return out


def _check(load: Callable[[], Any], names: tuple[str, ...], what: str) -> str | None:
    """None if ``load`` loads or fails with one line naming one of ``names``; else the problem."""
    try:
        load()
    except (ConfigError, FileNotFoundError) as e:
        msg = str(e)
        if not msg or "\n" in msg:
            return f"{what}: not one line: {msg!r}"
        if not any(n in msg for n in names):
            return f"{what}: does not name the file: {msg!r}"
    except Exception as e:  # noqa: BLE001 -- the point: any other exception is a bug
        return f"{what}: raw {type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize("src", EXPERIMENTS, ids=lambda p: p.name)
def test_mutated_experiments_load_or_fail_with_one_line(src: Path, tmp_path: Path) -> None:
    text = src.read_text()
    profiles = [None, *sorted((yaml.safe_load(text).get("profiles") or {}))]
    rng = random.Random(zlib.crc32(src.name.encode()))
    problems = []
    for i, (what, mutated) in enumerate(_mutations(text, zlib.crc32(src.name.encode()))):
        path = tmp_path / f"{i:03d}_{src.name}"
        path.write_text(mutated)
        profile = rng.choice(profiles)
        problems.append(_check(functools.partial(Experiment.load, path, profile=profile), (path.name,),
                               f"{src.name} #{i} ({what}, profile {profile})"))
    assert [p for p in problems if p] == []


@pytest.mark.parametrize("src", SWEEPS, ids=lambda p: p.name)
def test_mutated_sweeps_load_or_fail_with_one_line(src: Path, tmp_path: Path) -> None:
    tree = yaml.safe_load(src.read_text())
    base = (src.parent / tree["base"]).resolve()  # the mutated copies live elsewhere
    tree["base"] = str(base)
    text = yaml.safe_dump(tree, sort_keys=False)
    problems = []
    for i, (what, mutated) in enumerate(_mutations(text, zlib.crc32(src.name.encode()))):
        path = tmp_path / f"{i:03d}_{src.name}"
        path.write_text(mutated)
        problems.append(_check(functools.partial(load_sweep, path), (path.name, base.name),
                               f"{src.name} #{i} ({what})"))
    assert [p for p in problems if p] == []


def test_the_fuzz_covers_every_file_and_both_outcomes(tmp_path: Path) -> None:
    """The mutations are not all harmless, nor all fatal: some load, some fail (one line)."""
    assert len(EXPERIMENTS) >= 8 and len(SWEEPS) >= 2
    src = ROOT / "experiments" / "bandit_starpo_s.yaml"
    loaded = failed = 0
    for i, (_, mutated) in enumerate(_mutations(src.read_text(), 0)):
        path = tmp_path / f"{i}.yaml"
        path.write_text(mutated)
        try:
            Experiment.load(path, profile="cpu")
            loaded += 1
        except (ConfigError, FileNotFoundError):
            failed += 1
    assert loaded > 0 and failed > 0
