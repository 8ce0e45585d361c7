"""Parquet store of trajectory tables: one file per training iteration, written atomically.

Layout::

    <root>/<run_id>/trajectories/iter_000000.parquet
                                 iter_000001.parquet
                                 .tmp-iter_000002-<random>.partial   # a write in progress (or a crash)

- File names are zero-padded to six digits, so lexical order is numeric order (iterations
  0..999_999).
- A write goes to a temp file in the same directory (same filesystem, so the final rename is
  atomic), is flushed and fsynced, and only then gets its final name. A crash at any point
  leaves either the complete file or no file under the final name; at worst a ``.tmp-*`` file
  remains, which ``cleanup_temp_files`` removes.
- Temp files start with ``.`` and do not end in ``.parquet``. Both ``pyarrow.dataset`` and Ray
  Data (``ray.data.read_parquet(<dir>)``) skip files whose name starts with ``.`` or ``_`` when
  they expand a directory, so a reader of the directory never sees a partial file.
- Each file is plain Parquet with the Arrow schema (and so ``SCHEMA_VERSION``) in its metadata:
  ``pq.read_table(path)`` returns a table equal to the one written.

pyarrow only.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ragen_rllib.durable import CorruptFileError, DiskFullError, disk_full_reason, one_line
from ragen_rllib.trajectory.batch import validate_table
from ragen_rllib.trajectory.schema import READABLE_VERSIONS, SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY, Col

#: Subdirectory of a run directory that holds the iteration files.
TRAJECTORIES_DIR = "trajectories"
#: Subdirectory of a run directory that holds the validation rollouts, one store per validation env.
VALIDATION_DIR = "validation"
#: Prefix of in-progress/abandoned writes; readers ignore names starting with "." or "_".
TEMP_PREFIX = ".tmp-"
#: Largest storable iteration (six zero-padded digits keep lexical order == numeric order).
MAX_ITERATION = 999_999
#: Parquet compression codec (token ids compress well; readable by pyarrow and Ray Data).
COMPRESSION = "zstd"

_FILE_RE = re.compile(r"^iter_(\d{6})\.parquet$")
# Run ids become directory names; no separators, no leading "." / "_" (readers skip those), no
# "=" (hive partitioning would turn it into a column when a reader expands the root).
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]*$")

IterationSelection = range | Sequence[int] | None


class TrajectoryStore:
    """Write and read the trajectory tables of one run, one Parquet file per iteration.

    Args:
        root: Directory holding all runs (created on first write).
        run_id: Name of this run; letters, digits, ``.`` and ``-``, not starting with ``.``.
        subdir: Where inside the run directory the files go: ``trajectories`` (training rollouts)
            or ``validation_subdir(env)`` (the rollouts of each validation, ``iteration`` = the RL
            iterations done before it).

    Raises:
        ValueError: ``run_id`` is not a safe directory name.
    """

    def __init__(self, root: str | Path, run_id: str, subdir: str = TRAJECTORIES_DIR) -> None:
        if not _RUN_ID_RE.match(run_id):
            raise ValueError(f"run_id {run_id!r} must match {_RUN_ID_RE.pattern} (it becomes a directory name)")
        self.root = Path(root)
        self.run_id = run_id
        self.subdir = subdir

    def __repr__(self) -> str:
        return f"TrajectoryStore(root={str(self.root)!r}, run_id={self.run_id!r}, subdir={self.subdir!r})"

    @property
    def run_dir(self) -> Path:
        """``<root>/<run_id>``."""
        return self.root / self.run_id

    @property
    def directory(self) -> Path:
        """``<root>/<run_id>/<subdir>``: the directory to hand to ``ray.data.read_parquet``."""
        return self.run_dir / self.subdir

    def path_for(self, iteration: int) -> Path:
        """Return the final path of ``iteration``'s file (whether or not it exists).

        Raises:
            ValueError: ``iteration`` is outside 0..``MAX_ITERATION``.
        """
        if not 0 <= int(iteration) <= MAX_ITERATION:
            raise ValueError(f"iteration {iteration} outside 0..{MAX_ITERATION}")
        return self.directory / f"iter_{int(iteration):06d}.parquet"

    # ----------------------------------------------------------------------------------------
    # write
    # ----------------------------------------------------------------------------------------

    def write(self, iteration: int, table: pa.Table, *, overwrite: bool = False) -> Path:
        """Validate ``table`` and store it as ``iteration``'s file, atomically.

        Args:
            iteration: Training iteration; every row's ``iteration`` must equal it.
            table: Trajectory table (see ``validate_table``); every row's ``run_id`` must equal
                this store's ``run_id``. May be empty.
            overwrite: Replace an existing file for ``iteration`` (a redone iteration must say so).

        Returns:
            The final path.

        Raises:
            FileExistsError: The iteration is already stored and ``overwrite`` is False.
            ValueError: The table is invalid, or a row's ``run_id``/``iteration`` differs.
            DiskFullError: No room for the file; a previous file of ``iteration`` is left as it was.
        """
        final = self.path_for(iteration)
        if not overwrite and final.exists():
            raise FileExistsError(f"{final} exists: iteration {iteration} of run {self.run_id!r} is already "
                                  f"stored; pass overwrite=True to replace it")
        table = validate_table(table)
        _check_constant(table, Col.RUN_ID, self.run_id)
        _check_constant(table, Col.ITERATION, int(iteration))

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{final.stem}-", suffix=".partial",
                                            dir=self.directory)
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                _write_parquet(table, tmp)
                _fsync_file(tmp)
                _publish(tmp, final, overwrite=overwrite)
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink()
                raise
        except OSError as e:  # the file under the final name, if any, is the previous complete one
            if (reason := disk_full_reason(e)) is None:
                raise
            raise DiskFullError(final, reason) from e
        _fsync_dir(self.directory)  # make the rename itself durable
        return final

    def cleanup_temp_files(self, min_age_s: float = 0.0) -> int:
        """Delete leftover ``.tmp-*`` files of interrupted writes.

        Call it when no writer of this run is active (e.g. when a run resumes), or pass
        ``min_age_s`` larger than any write takes so that a write in progress is spared.

        Args:
            min_age_s: Only delete temp files last modified at least this many seconds ago.

        Returns:
            The number of files deleted.
        """
        if not self.directory.is_dir():
            return 0
        now, removed = time.time(), 0
        for path in self.directory.iterdir():
            if not path.name.startswith(TEMP_PREFIX):
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime >= min_age_s:
                    path.unlink()
                    removed += 1
        return removed

    def set_aside_after(self, iteration: int) -> list[Path]:
        """Move iteration files newer than ``iteration`` to ``<run>/trajectories_discarded/`` (kept, not read).

        A resume from a checkpoint taken after ``iteration`` redoes the later iterations; their
        first attempt (sampled by a policy that training no longer continues from) is kept on disk
        for inspection but leaves the run, so each iteration is read exactly once.

        Returns:
            the new paths of the moved files (``iter_NNNNNN.<unix time>.parquet``; outside the
            trajectories folder, so readers of that folder, e.g. ``ray.data``, never see them).
        """
        moved = []
        stamp = int(time.time())
        for it in self.iterations():
            if it > iteration:
                dest = self.run_dir / "trajectories_discarded" / f"{self.path_for(it).stem}.{stamp}.parquet"
                dest.parent.mkdir(exist_ok=True)
                os.replace(self.path_for(it), dest)
                moved.append(dest)
        if moved:
            _fsync_dir(self.directory)
        return moved

    # ----------------------------------------------------------------------------------------
    # read
    # ----------------------------------------------------------------------------------------

    def iterations(self) -> list[int]:
        """Return the stored iterations, ascending (temp files are not iterations)."""
        if not self.directory.is_dir():
            return []
        found = (_FILE_RE.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def read(
        self,
        iterations: IterationSelection = None,
        filter: pc.Expression | None = None,  # noqa: A002 - mirrors pyarrow.dataset's name
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Read stored iterations into one table, optionally filtered and projected.

        Args:
            iterations: Iterations to read (read in ascending order, duplicates ignored); None
                reads every stored iteration.
            filter: A ``pyarrow.compute`` expression evaluated by ``pyarrow.dataset`` (row groups
                are pruned by their statistics), e.g. ``pc.field(Col.SUCCESS) == True``.
            columns: Columns to return (``Col`` names); None returns all.

        Returns:
            The rows, in iteration order then written order. With ``columns=None`` the schema is
            exactly ``SCHEMA``. No stored iteration selected -> an empty table.

        Raises:
            FileNotFoundError: A requested iteration is not stored.
            ValueError: A file carries a schema version not in ``READABLE_VERSIONS`` (a file of
                an older readable version gets nulls in the columns it lacks).
            CorruptFileError: A selected file is truncated or damaged (a ``ValueError`` naming it);
                it is never skipped.
        """
        wanted = self.iterations() if iterations is None else sorted({int(i) for i in iterations})
        paths = [self.path_for(i) for i in wanted]
        if missing := [i for i, p in zip(wanted, paths, strict=False) if not p.is_file()]:
            raise FileNotFoundError(f"run {self.run_id!r} in {self.directory} has no iterations {missing[:20]} "
                                    f"(stored: {_summarise(self.iterations())})")
        for path in paths:
            _check_file_version(path)
        try:
            dataset = ds.dataset([str(p) for p in paths], schema=SCHEMA, format="parquet")
            return dataset.to_table(columns=list(columns) if columns is not None else None, filter=filter)
        except _UNREADABLE as e:  # a damaged page deep inside one file: name that file
            if isinstance(e, FileNotFoundError):
                raise
            for path in paths:
                _read_whole(path)
            raise

    def read_iteration(self, iteration: int) -> pa.Table:
        """Read one iteration's table (schema exactly ``SCHEMA``).

        Raises:
            FileNotFoundError: The iteration is not stored.
        """
        return self.read([iteration])


def read_run(
    path_or_root: str | Path,
    run_id: str | None = None,
    iterations: IterationSelection = None,
    filter: pc.Expression | None = None,  # noqa: A002
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Read a run's trajectories without building a store by hand.

    Args:
        path_or_root: The store root when ``run_id`` is given; otherwise the run directory
            (``<root>/<run_id>``) or its ``trajectories`` directory.
        run_id: The run to read under ``path_or_root``.
        iterations: See ``TrajectoryStore.read``.
        filter: See ``TrajectoryStore.read``.
        columns: See ``TrajectoryStore.read``.

    Returns:
        The selected rows (see ``TrajectoryStore.read``).

    Raises:
        FileNotFoundError: ``path_or_root`` is not a run (or trajectories) directory.
    """
    path = Path(path_or_root)
    if run_id is None:
        if path.name == TRAJECTORIES_DIR and not (path / TRAJECTORIES_DIR).is_dir():
            path = path.parent
        if not (path / TRAJECTORIES_DIR).is_dir():
            raise FileNotFoundError(f"{path} is not a run directory (no {TRAJECTORIES_DIR}/ inside); "
                                    f"pass the store root and run_id, or a run directory")
        path, run_id = path.parent, path.name
    return TrajectoryStore(path, run_id).read(iterations, filter=filter, columns=columns)


def validation_subdir(env: str) -> str:
    """``validation/<env>`` with ``:`` as ``-`` (``frozen_lake:guided`` -> ``validation/frozen_lake-guided``)."""
    return f"{VALIDATION_DIR}/{env.replace(':', '-')}"


def validation_store(run_dir: str | Path, env: str) -> TrajectoryStore:
    """The store of a run's validation rollouts on ``env`` (``<run_dir>/validation/<env>``)."""
    run_dir = Path(run_dir)
    return TrajectoryStore(run_dir.parent, run_dir.name, validation_subdir(env))


def validation_envs(run_dir: str | Path) -> list[str]:
    """The envs a run stored validations of, as ``env`` or ``env:variant`` (sorted; the inverse of
    ``validation_subdir``: ``validation/frozen_lake-guided`` -> ``frozen_lake:guided``); [] if none."""
    d = Path(run_dir) / VALIDATION_DIR
    return sorted(p.name.replace("-", ":", 1) for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


def list_runs(root: str | Path) -> list[str]:
    """Return the run ids under ``root`` (directories holding a ``trajectories/``), sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / TRAJECTORIES_DIR).is_dir())


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _write_parquet(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` (a separate function so tests can simulate a crash in it)."""
    # Keep Arrow's list element name ("item") so pq.read_table returns a schema *equal* to SCHEMA;
    # the Parquet-"compliant" name ("element") would differ in Schema.equals(check_metadata=True).
    # Every Parquet reader accepts both names.
    pq.write_table(table, str(path), compression=COMPRESSION, use_compliant_nested_type=False)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform/filesystem lets one fsync a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(tmp: Path, final: Path, *, overwrite: bool) -> None:
    """Give the complete temp file its final name, atomically.

    Without ``overwrite`` a hard link creates the final name only if it is absent (atomic, so
    two writers of one iteration cannot both succeed); filesystems without hard links fall back
    to check-then-``os.replace``.
    """
    if overwrite:
        os.replace(tmp, final)
        return
    try:
        os.link(tmp, final)
    except FileExistsError:
        raise FileExistsError(f"{final} appeared during the write; pass overwrite=True to replace it") from None
    except OSError:
        if final.exists():
            raise FileExistsError(f"{final} appeared during the write; pass overwrite=True to replace it") from None
        os.replace(tmp, final)
    else:
        tmp.unlink()


def _check_constant(table: pa.Table, name: str, value: str | int) -> None:
    if table.num_rows == 0:
        return
    equal = pc.equal(table[name], pa.scalar(value, table.schema.field(name).type))
    if not pc.all(equal).as_py():
        row = pc.index(equal, False).as_py()
        raise ValueError(f"column {name!r} row {row}: {table[name][row].as_py()!r} != {value!r} "
                         f"(every row must belong to the run/iteration being written)")


# What pyarrow raises on a truncated or damaged Parquet file (ArrowInvalid is also a ValueError).
_UNREADABLE = (pa.ArrowException, OSError)


def _read_whole(path: Path) -> None:
    """Decode every page of ``path``, or raise ``CorruptFileError`` naming it."""
    try:
        pq.read_table(path)
    except FileNotFoundError:
        raise
    except _UNREADABLE as e:
        raise CorruptFileError(path, f"{type(e).__name__}: {one_line(str(e))}") from e


def _check_file_version(path: Path) -> None:
    try:
        meta = pq.read_schema(path).metadata
    except FileNotFoundError:
        raise
    except _UNREADABLE as e:  # a truncated file has no footer, so no schema
        raise CorruptFileError(path, f"{type(e).__name__}: {one_line(str(e))}") from e
    version = (meta or {}).get(SCHEMA_VERSION_KEY)
    if version is None or version.decode() not in READABLE_VERSIONS:
        found = None if version is None else version.decode()
        raise ValueError(f"{path}: schema version {found!r}, this code reads {list(READABLE_VERSIONS)} "
                         f"(writes {SCHEMA_VERSION!r})")


def _summarise(iterations: list[int]) -> str:
    if len(iterations) <= 10:
        return str(iterations)
    return f"{len(iterations)} iterations {iterations[0]}..{iterations[-1]}"
