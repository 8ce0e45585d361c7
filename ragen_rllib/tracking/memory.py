"""Peak memory of a run summed over all its processes: the driver and every descendant (a local
Ray cluster's GCS, raylet and workers, env-runner actors, vLLM engine processes).

Two sums, sampled by a daemon thread:

* ``rss``: resident set size summed over processes. Pages shared between processes (the torch
  libraries every Python process maps, Ray's object store) count once per process, so this
  over-counts; it is the conservative figure and the one logged as ``sys/peak_rss_gb``.
* ``pss``: proportional set size (each shared page split between the processes that map it), the
  honest total of the machine's memory the run holds (``sys/peak_pss_gb``; Linux only).

A descendant younger than ``MIN_CHILD_AGE_S`` is not counted: a fork shows its parent's whole RSS
until it execs (vLLM runs ``lscpu`` through a shell, the MLflow tags run ``git``), and one sample
in such a moment counted the 0.9 GB driver twice (a LoRA ``make run`` at 4.45 GB instead of 3.5).
Any process that lives longer is counted from its second half-second on.

Units: GB = 1e9 bytes.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

__all__ = ["MIN_CHILD_AGE_S", "PeakMemory", "tree_memory_gb"]

#: Seconds a descendant must have lived to be counted (see the module docstring).
MIN_CHILD_AGE_S = 0.5


def tree_memory_gb(pid: int | None = None, with_pss: bool = True,
                   min_age_s: float = MIN_CHILD_AGE_S) -> tuple[float, float]:
    """Summed (RSS, PSS) in GB of process ``pid`` (default: this one) and its descendants that have
    lived ``min_age_s`` seconds or more.

    PSS is 0.0 where the platform does not report it (or ``with_pss`` is False). Processes that
    exit while being read are skipped.
    """
    root = psutil.Process(pid or os.getpid())
    rss = pss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            if proc is not root and _age_s(proc) < min_age_s:
                continue
            if with_pss:
                info = proc.memory_full_info()
                rss += info.rss
                pss += getattr(info, "pss", 0)
            else:
                rss += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return rss / 1e9, pss / 1e9


def _age_s(proc: psutil.Process) -> float:
    """Seconds since ``proc`` started. On Linux from ``/proc`` in clock ticks (10 ms): psutil's
    ``create_time`` adds a boot time rounded to whole seconds, up to 1 s off from ``time.time()``."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:  # the name (field 2) may hold spaces: split after ")"
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time() - proc.create_time()


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
