"""``scoped_environ``: environment variables changed for a block, then put back as they were.

Libraries read some settings only from the environment (vLLM's thread and cache variables, the
URL Ray's job client prefers over its argument, the variables of ``console.LIBRARY_ENV``). Each
place that changes them for a while restores them with this one function, also when the block
raises, so a variable that was unset before is unset again, not left as an empty string.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def scoped_environ(values: Mapping[str, str] | None = None, *, unset: Iterable[str] = (),
                   restore: Iterable[str] = ()) -> Iterator[None]:
    """For the ``with`` block: set ``values``, remove the ``unset`` names, and leave the ``restore``
    names to the block; on exit each of these names gets back its value from before (or is unset).

    Raises:
        ValueError: a name both set and unset.
    """
    values = dict(values or {})
    unset = list(unset)
    if both := sorted(set(values) & set(unset)):
        raise ValueError(f"scoped_environ: {both} both set and unset")
    before = {k: os.environ.get(k) for k in (*values, *unset, *restore)}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
