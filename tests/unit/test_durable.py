"""Storage faults: disk-full detection, the two one-line errors, damaged Parquet files named by the
store's reader, and the checkpoint's size manifest (save, verify, a full disk mid-save)."""

from __future__ import annotations

import copy
import errno
import json
import os
import pickle
from pathlib import Path

import pytest

from ragen_rllib.durable import CorruptFileError, DiskFullError, disk_full_reason
from ragen_rllib.trajectory import TrajectoryStore

from test_trajectory_store import make_table


@pytest.mark.parametrize("err", [DiskFullError("/r/iter_000001.parquet", "No space left on device"),
                                 CorruptFileError("/r/state.pkl", "12 bytes\nand more")])
def test_errors_survive_copy_and_pickle(err: Exception) -> None:
    # Ray Tune re-raises a copy of what training_step raised; Ray pickles errors across processes.
    for again in (copy.copy(err), pickle.loads(pickle.dumps(err))):
        assert type(again) is type(err) and str(again) == str(err) and again.path == err.path
    assert "\n" not in str(err)


def test_disk_full_reason_follows_the_chain_and_trusts_other_errnos() -> None:
    assert disk_full_reason(OSError(errno.ENOSPC, "No space left on device")) == os.strerror(errno.ENOSPC)
    assert disk_full_reason(OSError(errno.EDQUOT, "quota")) == os.strerror(errno.EDQUOT)
    try:
        try:
            raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
        except OSError as inner:
            raise RuntimeError("wrapped by a library") from inner
    except RuntimeError as outer:
        assert disk_full_reason(outer) == os.strerror(errno.EFBIG)
    # pyarrow keeps the text even where an errno is lost
    assert disk_full_reason(RuntimeError(f"write failed: {os.strerror(errno.ENOSPC)}")) == os.strerror(errno.ENOSPC)
    assert disk_full_reason(OSError(errno.EACCES, "Permission denied"), where="/") is None
    assert disk_full_reason(RuntimeError("unexpected pos 576 vs 534"), where=None) is None


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # same size, garbage in the middle
        mid = len(data) // 8
        data[mid:mid + 64] = bytes(range(64))
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "damaged"])
def test_store_names_an_unreadable_file_and_never_skips_it(tmp_path: Path, how: str) -> None:
    store = TrajectoryStore(tmp_path, "run-a")
    for it in range(3):
        store.write(it, make_table(it, run_id="run-a"))
    _damage(store.path_for(1), how)
    with pytest.raises(CorruptFileError) as err:
        store.read()
    assert err.value.path == store.path_for(1) and str(err.value).startswith(
        f"corrupt or truncated file {store.path_for(1)}: ")
    assert isinstance(err.value, ValueError)  # callers that turn ValueError into one line keep working
    assert store.read([0, 2]).num_rows == 2 * make_table(0, run_id="run-a").num_rows


class _FakeAlgo:
    """Writes a two-file checkpoint; optionally runs out of space after the first file."""

    def __init__(self, payload: bytes, full_after_first: bool = False) -> None:
        self.payload, self.full_after_first = payload, full_after_first

    def save_to_path(self, path: str) -> None:
        Path(path, "sub").mkdir(parents=True)
        Path(path, "sub", "state.pkl").write_bytes(self.payload)
        if self.full_after_first:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        Path(path, "meta.json").write_text("{}")


def test_checkpoint_manifest_names_a_truncated_or_missing_file(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.train import MANIFEST_FILE, read_checkpoint_history, save_checkpoint

    ckpt = save_checkpoint(_FakeAlgo(b"x" * 1000), tmp_path, [{"rollout/success": 0.5}])
    assert json.loads((ckpt / MANIFEST_FILE).read_text()) == {"meta.json": 2, "sub/state.pkl": 1000}
    assert read_checkpoint_history(ckpt) == [{"rollout/success": 0.5}]

    with open(ckpt / "sub" / "state.pkl", "r+b") as f:
        f.truncate(400)
    with pytest.raises(CorruptFileError, match=r"state\.pkl: 400 bytes, the checkpoint was written with 1000 bytes"):
        read_checkpoint_history(ckpt)
    (ckpt / "sub" / "state.pkl").unlink()
    with pytest.raises(CorruptFileError) as err:
        read_checkpoint_history(ckpt)
    assert err.value.path == ckpt / "sub" / "state.pkl" and "missing" in str(err.value)


def test_a_full_disk_mid_checkpoint_keeps_the_previous_one(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.train import read_checkpoint_history, save_checkpoint

    ckpt = save_checkpoint(_FakeAlgo(b"a" * 100), tmp_path, [{"step": 0.0}])
    with pytest.raises(DiskFullError) as err:
        save_checkpoint(_FakeAlgo(b"b" * 100, full_after_first=True), tmp_path, [{"step": 0.0}, {"step": 1.0}])
    assert str(err.value) == f"disk full while writing {ckpt}: {os.strerror(errno.ENOSPC)}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]  # the partial copy is gone
    assert (ckpt / "sub" / "state.pkl").read_bytes() == b"a" * 100
    assert read_checkpoint_history(ckpt) == [{"step": 0.0}]


def test_corrupt_resume_json_is_named(tmp_path: Path) -> None:
    from ragen_rllib.algorithms.starpo.train import RESUME_FILE, read_resume_info, save_checkpoint

    save_checkpoint(_FakeAlgo(b"a"), tmp_path, [])
    (tmp_path / RESUME_FILE).write_text('{"config": {"iterations"')
    with pytest.raises(CorruptFileError) as err:
        read_resume_info(tmp_path)
    assert err.value.path == tmp_path / RESUME_FILE and "not valid JSON" in str(err.value)


def test_a_file_size_limit_fails_the_arrow_write_and_keeps_the_previous_file(tmp_path: Path) -> None:
    # A real kernel EFBIG: the child lowers RLIMIT_FSIZE below the file's size, then rewrites it.
    import subprocess
    import sys

    code = f"""
import resource, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_trajectory_store import make_table
from ragen_rllib.trajectory import TrajectoryStore
store = TrajectoryStore({str(tmp_path)!r}, "run-a")
first = store.write(0, make_table(0, run_id="run-a"))
limit = first.stat().st_size // 2
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    store.write(0, make_table(0, run_id="run-a", n_groups=3), overwrite=True)
except Exception as e:
    print(type(e).__name__, e)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    store = TrajectoryStore(tmp_path, "run-a")
    expected = f"DiskFullError disk full while writing {store.path_for(0)}: {os.strerror(errno.EFBIG)}"
    assert p.stdout.strip() == expected, p.stdout + p.stderr
    assert [f.name for f in store.directory.iterdir()] == [store.path_for(0).name]  # no partial file left
    assert store.read().equals(make_table(0, run_id="run-a"))  # the previous version, intact
