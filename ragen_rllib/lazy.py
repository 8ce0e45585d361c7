"""``LazyMapping``: a read-only mapping whose values are computed when read, one at a time.

Why: a weight sync walks the policy's tensors once, in order. When each tensor is new (LoRA's
merged weights, ``W + scaling * B @ A``), building them all before the first is loaded held a
second copy of the adapted layers (0.42 GB float32 for SmolLM2-135M; 28 GB for a 7B model).
Computed per read, only one is alive at a time. Pickling (a Ray object, a remote learner's reply)
turns it into a plain ``dict``, so it never carries the function or the model behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LazyMapping(Mapping[K, V]):
    """``{key: compute(key) for key in keys}``, with each value computed on every read, never stored.

    Args:
        keys: the keys, in iteration order (copied).
        compute: the value of one key; called once per read.
    """

    def __init__(self, keys: Iterable[K], compute: Callable[[K], V]) -> None:
        self._keys = list(keys)
        self._index = set(self._keys)
        if len(self._index) != len(self._keys):
            raise ValueError("LazyMapping: duplicate keys")
        self._compute = compute

    def __getitem__(self, key: K) -> V:
        if key not in self._index:
            raise KeyError(key)
        return self._compute(key)

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: object) -> bool:
        return key in self._index

    def map_values(self, fn: Callable[[V], Any]) -> LazyMapping[K, Any]:
        """A lazy mapping of ``fn(value)`` over the same keys (still computed per read)."""
        return LazyMapping(self._keys, lambda k: fn(self._compute(k)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self.items()),))

    def __repr__(self) -> str:
        return f"LazyMapping({len(self._keys)} keys)"


def map_values(mapping: Mapping[K, V], fn: Callable[[V], Any]) -> Mapping[K, Any]:
    """``fn`` over ``mapping``'s values: lazily for a ``LazyMapping``, as a new dict otherwise."""
    if isinstance(mapping, LazyMapping):
        return mapping.map_values(fn)
    return {k: fn(v) for k, v in mapping.items()}


__all__ = ["LazyMapping", "map_values"]
