"""Storage faults: a full disk and a damaged file, each reported in one line that names the file.

- ``DiskFullError``: a write ran out of space (``ENOSPC``), hit a file-size limit (``EFBIG``)
  or a quota (``EDQUOT``). Writers of run files write to a temp name in the same folder and
  rename it into place only when complete, so the error leaves the previous version intact.
- ``CorruptFileError``: a file exists but cannot be read back (truncated, damaged). Readers
  raise it instead of skipping the file.

The CLI prints either as ``error: <message>`` and exits with code 1. Stdlib only: every layer
may raise them.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

#: errno values that mean "no room for this write".
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
# Some writers (pyarrow, torch) lose the errno on the way up; their messages keep the text.
_DISK_FULL_TEXTS = tuple(os.strerror(e) for e in sorted(DISK_FULL_ERRNOS))
# Below this many free bytes, a failed write is blamed on the disk even without an errno.
_NEARLY_FULL_BYTES = 1 << 20


class DiskFullError(OSError):
    """A write found no room: ``disk full while writing <path>: <reason>``.

    Attributes:
        path: the file or folder being written (the final name, not the temp name).
        reason: what the system said, e.g. ``No space left on device``.
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"disk full while writing {path}: {reason}")
        self.path, self.reason = Path(path), reason

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:  # copy/pickle (Ray, Tune) rebuild from both
        return type(self), (self.path, self.reason)


class CorruptFileError(ValueError):
    """A file that cannot be read back: ``corrupt or truncated file <path>: <reason>``.

    A ``ValueError``, so callers that already turn ``ValueError`` into one line keep working.

    Attributes:
        path: the unreadable file.
        reason: why, in one line (the reader's own message where it has one).
    """

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"corrupt or truncated file {path}: {one_line(reason)}")
        self.path, self.reason = Path(path), one_line(reason)

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:
        return type(self), (self.path, self.reason)


def disk_full_reason(exc: BaseException, where: str | os.PathLike | None = None) -> str | None:
    """Why ``exc`` is a full disk (the system's text), or None when it is not one.

    Follows ``__cause__``/``__context__`` and Ray's ``cause``, so a wrapped error counts. An
    error with no errno anywhere in that chain counts when the filesystem of ``where`` has under
    1 MiB free (torch's writer, for one, reports a short write as a ``RuntimeError``).

    Args:
        exc: the error a write raised.
        where: a path on the filesystem written to, checked for free space; None skips that check.
    """
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    has_errno = False
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return os.strerror(e.errno)
        has_errno = has_errno or (isinstance(e, OSError) and e.errno is not None)
        text = str(e)
        for t in _DISK_FULL_TEXTS:
            if t in text:
                return t
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    if where is not None and not has_errno:  # an errno that is not ENOSPC says what went wrong
        free = free_bytes(where)
        if free is not None and free < _NEARLY_FULL_BYTES:
            return f"{os.strerror(errno.ENOSPC)} ({free} bytes free; the writer said: {one_line(str(exc))})"
    return None


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent); None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's data, or a folder's entries, to the device (a folder that refuses is skipped)."""
    is_dir = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if is_dir:  # not every platform/filesystem lets one open a folder
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)


def one_line(text: str) -> str:
    """The first non-empty line of ``text`` (stripped); messages of readers can span many."""
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
