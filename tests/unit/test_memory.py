"""Peak memory over the process tree (``sys/peak_rss_gb``): it sees child processes, but not a fork in
the instant before it execs (it would count its parent twice)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ragen_rllib.tracking.memory import MIN_CHILD_AGE_S, PeakMemory, tree_memory_gb


def test_peak_includes_a_child_process_holding_memory() -> None:
    alone_rss, _ = tree_memory_gb()
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(300 * 10**6); import time; time.sleep(30)"])
    try:
        with PeakMemory(interval_s=0.05) as mem:
            deadline = time.time() + 20
            while mem.peak_rss_gb < alone_rss + 0.25 and time.time() < deadline:
                time.sleep(0.05)
        assert mem.peak_rss_gb >= alone_rss + 0.25  # the child's 300 MB counted
        assert mem.peak_pss_gb > 0
        assert set(mem.metrics()) == {"sys/peak_rss_gb", "sys/peak_pss_gb"}
    finally:
        child.kill()
        child.wait()


def test_a_fresh_fork_is_not_counted_until_it_has_lived_min_age() -> None:
    held = bytearray(400 * 10**6)  # touched pages: resident in the parent and, after fork, in the child
    held[:: 4096] = b"x" * len(held[:: 4096])
    alone_rss, _ = tree_memory_gb(with_pss=False)
    pid = os.fork()
    if pid == 0:  # the child: parent's pages, no exec, then gone
        time.sleep(3 * MIN_CHILD_AGE_S + 1)
        os._exit(0)
    try:
        young, _ = tree_memory_gb(with_pss=False)
        time.sleep(MIN_CHILD_AGE_S + 0.2)
        grown, _ = tree_memory_gb(with_pss=False)
    finally:
        os.waitpid(pid, 0)
    assert young < alone_rss + 0.2  # the fork's borrowed 0.4 GB not counted at once
    assert grown >= alone_rss + 0.35  # counted once it has lived MIN_CHILD_AGE_S
    del held
