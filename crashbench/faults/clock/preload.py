"""libfaketime, preloaded into a process: where the library is, the environment that skews a process's
wall clock, and whether a server binary runs under it.

The library is the one the PyPI package `libfaketime` ships (`pip install 'crashbench[clock]'`; a run with a clock fault
without it stops before its first worker, exit 2), found
by path without importing the package (its import reads the environment and may re-exec). LD_PRELOAD
takes effect when a program is exec'd, so a skewed worker is exec'd into a fresh interpreter
(crashbench.run.harness). FAKETIME="+30s" moves the wall clock (time.time(), datetime.now()) by a fixed
offset from the real one and lets it run at the real rate; FAKETIME_DONT_FAKE_MONOTONIC=1 leaves
CLOCK_MONOTONIC alone, so only the wall clock is wrong, as an NTP-less host's is, and the ledger (written
on the monotonic clock) stays on the harness's clock. The skew a worker really had is measured, not
assumed: at start each such worker appends its (time.time(), time.monotonic()) to a probe file
(crashbench.control.interpreter.CLOCK_PROBE_ENV), which the harness compares with its own pair.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
import time
from pathlib import Path

from crashbench.control.interpreter import CLOCK_PROBE_ENV
from crashbench.errors import UsageError

PACKAGE = "libfaketime"
LIBRARY = Path("vendor", "libfaketime", "src", "libfaketime.so.1")  # inside the package
SERVER_PROBE_TIMEOUT = 5.0


def library() -> Path | None:
    """The preloadable libfaketime.so.1 of the installed `libfaketime` package, or None."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for where in spec.submodule_search_locations:
        if (so := Path(where) / LIBRARY).is_file():
            return so
    return None


def faketime(skew: float) -> str:
    """libfaketime's FAKETIME for a wall clock `skew` seconds ahead (+) or behind (-) the real one."""
    return f"{skew:+g}s"


def env(skew: float, probe: str) -> dict[str, str]:
    """What a worker's environment gains to run `skew` s off, appending its clocks' reading to `probe`."""
    so = library()
    if so is None:
        raise UsageError(
            "a clock fault needs libfaketime, which is not installed", hint="pip install 'crashbench[clock]'"
        )
    return {
        "LD_PRELOAD": str(so),
        "FAKETIME": faketime(skew),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        CLOCK_PROBE_ENV: probe,
    }


def read_probe(path: Path) -> list[tuple[str, float]]:
    """Each start's (worker name, skew in seconds) from a probe file: the worker's wall clock minus the
    harness's at the same monotonic instant (CLOCK_MONOTONIC is one clock for the whole machine)."""
    ours = time.time() - time.monotonic()
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, wall, mono = line.split()
        out.append((name, round(float(wall) - float(mono) - ours, 3)))
    return out


def server_runs(binary: str, skew: float = 30.0, timeout: float = SERVER_PROBE_TIMEOUT) -> tuple[bool, str]:
    """Whether the server `binary` comes up under libfaketime and answers TIME `skew` s off: (works,
    why). valkey's server does; Debian's redis-server (jemalloc) hangs before it listens."""
    import redis

    with tempfile.TemporaryDirectory(prefix="crashbench-faketime-") as d:
        sock = Path(d) / "s.sock"
        e = {**os.environ, **env(skew, str(Path(d) / "probe"))}
        argv = [binary, "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no", "--dir", d]
        proc = subprocess.Popen(argv, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout
            while not sock.exists():
                if proc.poll() is not None:
                    return False, f"{binary} exited {proc.returncode} under libfaketime"
                if time.monotonic() > deadline:
                    return False, f"{binary} did not listen within {timeout:g} s under libfaketime (hangs)"
                time.sleep(0.05)
            client = redis.Redis(unix_socket_path=str(sock), socket_timeout=timeout)
            secs, micros = client.time()
            off = secs + micros / 1e6 - time.time()
            client.close()
            if abs(off - skew) > 2:
                return False, f"{binary} runs under libfaketime but its clock is {off:+.1f} s off, not {skew:+g}"
            return True, f"{binary} runs under libfaketime, its TIME {off:+.1f} s off"
        finally:
            proc.kill()
            proc.wait()
