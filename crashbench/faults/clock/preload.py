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

from crashbench.control.clockprobe import CLOCK_WATCH_ENV
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


def timed_env(offset_file: str, probe: str) -> dict[str, str]:
    """What a process's environment gains to take its wall clock's offset from `offset_file`, read again at
    every clock call (FAKETIME_NO_CACHE: a change lands at once; measured about 8 us a call, against 0.3 us
    with a fixed FAKETIME), so that the harness moves it while it runs (a jump, a strobe). FAKETIME must
    be unset: libfaketime reads no file when it is set. A missing file is libfaketime's "+0": the real
    clock. A worker watches its clock and appends each change it sees to `probe`."""
    e = env(0.0, probe)
    del e["FAKETIME"]
    return {**e, "FAKETIME_TIMESTAMP_FILE": offset_file, "FAKETIME_NO_CACHE": "1", CLOCK_WATCH_ENV: "1"}


# What a server's environment takes of timed_env: the library and its offset file, no probe of a worker's
SERVER_KEYS = ("LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE", "FAKETIME_NO_CACHE", "FAKETIME_DONT_FAKE_MONOTONIC")


def write_offset(path: Path, skew: float) -> None:
    """The offset every process reading `path` runs at from its next clock call (0: the real clock),
    replaced whole (a reader sees the old line or the new one, never half of one)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(faketime(skew) + "\n")
    os.replace(tmp, path)


def readings(path: Path) -> list[tuple[str, float, float]]:
    """Each line of a probe file as (worker name, monotonic time, skew in seconds): the worker's wall
    clock minus the harness's at the same monotonic instant (CLOCK_MONOTONIC is one clock for the whole
    machine)."""
    ours = time.time() - time.monotonic()
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, wall, mono = line.split()
        out.append((name, float(mono), round(float(wall) - float(mono) - ours, 3)))
    return out


def read_probe(path: Path) -> list[tuple[str, float]]:
    """Each start's (worker name, skew in seconds) from the probe file of a fixed skew (one line a start)."""
    return [(name, skew) for name, _, skew in readings(path)]


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
