"""Peak memory of a run summed over all its processes: the driver and every descendant (a local
Ray cluster's GCS, raylet and workers, env-runner actors, vLLM engine processes).

Two sums, sampled by a daemon thread:

* ``rss``: resident set size summed over processes. Pages shared between processes (the torch
  libraries every Python process maps, Ray's object store) count once per process, so this
  over-counts; it is the conservative figure and the one logged as ``sys/peak_rss_gb``.
* ``pss``: proportional set size (each shared page split between the processes that map it), the
  honest total of the machine's memory the run holds (``sys/peak_pss_gb``; Linux only).

Units: GB = 1e9 bytes.
"""

from __future__ import annotations

import os
import threading

import psutil

__all__ = ["PeakMemory", "tree_memory_gb"]

def tree_memory_gb(pid: int | None = None, with_pss: bool = True) -> tuple[float, float]:
    """Summed (RSS, PSS) in GB of process ``pid`` (default: this one) and all its descendants.

    PSS is 0.0 where the platform does not report it (or ``with_pss`` is False). Processes that
    exit while being read are skipped.
    """
    root = psutil.Process(pid or os.getpid())
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            if with_pss:
                info = proc.memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", 0)
            else:
                rss += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return rss / 1e9, pss / 1e9


class PeakMemory:
    """Track the peak of ``tree_memory_gb`` every ``interval_s`` seconds until ``stop`` (RSS every
    sample, PSS every ``pss_every``-th: its peak is sampled more coarsely).

    Use as a context manager or ``start()`` / ``stop()``; ``peak_rss_gb`` and ``peak_pss_gb`` can
    be read at any time (the peak so far).
    """

    def __init__(self, interval_s: float = 0.5, pid: int | None = None, pss_every: int = 10) -> None:
        self.interval_s, self.pid, self.pss_every = interval_s, pid, pss_every
        self.peak_rss_gb = self.peak_pss_gb = 0.0
        self._samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, with_pss: bool = True) -> tuple[float, float]:
        """Take one sample now, update the peaks and return (rss, pss) in GB (pss 0.0 without it)."""
        rss, pss = tree_memory_gb(self.pid, with_pss=with_pss)
        self.peak_rss_gb, self.peak_pss_gb = max(self.peak_rss_gb, rss), max(self.peak_pss_gb, pss)
        return rss, pss

    def _run(self) -> None:
        while not self._stop.is_set():
            try:  # PSS reads every mapping of every process (smaps): only every pss_every-th sample
                self.sample(with_pss=self._samples % self.pss_every == 0)
                self._samples += 1
            except Exception:  # noqa: BLE001 -- a monitor must never take the run down
                pass
            self._stop.wait(self.interval_s)

    def start(self) -> "PeakMemory":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def metrics(self) -> dict[str, float]:
        """``sys/peak_rss_gb`` and ``sys/peak_pss_gb`` (peaks so far)."""
        return {"sys/peak_rss_gb": self.peak_rss_gb, "sys/peak_pss_gb": self.peak_pss_gb}

    def __enter__(self) -> "PeakMemory":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
