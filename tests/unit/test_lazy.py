"""``ragen_rllib.lazy.LazyMapping``: values computed per read, a plain dict when pickled."""

from __future__ import annotations

import pickle

import pytest

from ragen_rllib.lazy import LazyMapping, map_values


def test_values_are_computed_on_each_read_in_key_order() -> None:
    reads: list[str] = []

    def compute(k: str) -> int:
        reads.append(k)
        return len(k)

    m = LazyMapping(["a", "bbb", "cc"], compute)
    assert reads == [] and len(m) == 3 and list(m) == ["a", "bbb", "cc"] and "cc" in m and "z" not in m
    assert list(m.items()) == [("a", 1), ("bbb", 3), ("cc", 2)]
    assert reads == ["a", "bbb", "cc"]
    assert m["a"] == 1 and reads[-1] == "a"  # read again: computed again, never stored
    with pytest.raises(KeyError):
        m["z"]
    assert m.get("z", 0) == 0


def test_duplicate_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        LazyMapping(["a", "a"], str)


def test_pickling_gives_a_plain_dict_without_the_function() -> None:
    m = LazyMapping(["x", "y"], lambda k: k * 2)  # a lambda: not picklable itself
    copied = pickle.loads(pickle.dumps(m))
    assert type(copied) is dict and copied == {"x": "xx", "y": "yy"}


def test_map_values_stays_lazy_for_lazy_mappings_and_copies_plain_ones() -> None:
    reads: list[str] = []
    m = LazyMapping(["a", "b"], lambda k: reads.append(k) or k)
    up = map_values(m, str.upper)
    assert isinstance(up, LazyMapping) and reads == []
    assert dict(up) == {"a": "A", "b": "B"} and reads == ["a", "b"]
    assert map_values({"a": 1}, lambda v: v + 1) == {"a": 2}
