"""CPU accounting the benchmarks share: a process's CPU time, the whole machine's, and which process
listens on a port (the broker), all from /proc and `ss`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (all cores), from /proc/stat."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz


def listening_pid(port: int) -> int | None:
    """The process listening on `port` (the broker), if this user may see it."""
    try:
        out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for token in out.replace(",", " ").split():
        if token.startswith("pid="):
            return int(token[4:])
    return None
