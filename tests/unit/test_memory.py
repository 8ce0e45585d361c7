"""Peak memory over the process tree (``sys/peak_rss_gb``): it sees child processes."""

from __future__ import annotations

import subprocess
import sys
import time

from ragen_rllib.tracking.memory import PeakMemory, tree_memory_gb


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
