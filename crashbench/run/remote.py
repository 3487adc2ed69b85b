"""A worker's entry on a host reached over SSH (crashbench.control.sshworker starts it), and the host's
own small commands (crashbench.faults.hosts.ssh runs them). Runs under the host's Python, with
crashbench from the zip the run shipped on its PYTHONPATH; imports nothing heavy before the worker does.

    python -m crashbench.run.remote worker HOME NAME     the worker NAME, its files in HOME (spec.json,
                                                         ledger, pid); the server's URL is the first line
                                                         of its stdin, never an argument; then one line
                                                         out, its pid; then, for each line in, its
                                                         monotonic clock (the stub's probes of the
                                                         offset), until `go OFFSET`: the worker starts,
                                                         its clock that less OFFSET (the harness's)
    python -m crashbench.run.remote signal SIG ROOT      SIG to every worker of the run (ROOT/*/pid, each
                                                         its process group); STOP waits until the kernel
                                                         reports each stopped

A worker started this way is its own process group (a session's leader): a signal to the group reaches a
library's children too. It stops on its own once its parent (the SSH server's session) is gone, as a
local worker does once crashbench is, and then removes HOME: nobody is left to read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

STOP_WAIT_S = 2.0
OFFSET_ENV = "CRASHBENCH_CLOCK_OFFSET"  # crashbench.model.hostclock's, not imported: it reads it at import


def worker(home: Path, name: str) -> int:
    from crashbench.control.interpreter import URL_ENV

    url = sys.stdin.readline().strip()
    if url:
        os.environ[URL_ENV] = url
    with contextlib.suppress(PermissionError):  # already a session's leader (the SSH server made it one)
        os.setsid()
    parent = os.getppid()
    (home / "pid").write_text(str(os.getpid()))
    _say(str(os.getpid()))
    for line in sys.stdin:  # the stub's probes, each answered with this clock, until it says go
        if not line.startswith("go "):
            _say(f"{time.monotonic():.6f}")
            continue
        os.environ[OFFSET_ENV] = line.split()[1]  # before the worker imports crashbench.model.hostclock
        break
    else:
        return 1  # the stub went before it said go
    from crashbench.run import worker as body

    try:
        return body.main([str(home / "spec.json"), name, str(home / "ledger"), str(parent)])
    finally:
        if os.getppid() != parent:  # its stub is gone: the ledger will not be read
            shutil.rmtree(home, ignore_errors=True)


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def signal_all(sig: str, root: Path) -> int:
    signum = signal.Signals["SIG" + sig.removeprefix("SIG")]
    pids = []
    for f in root.glob("*/pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(f.read_text())
            os.killpg(pid, signum)
            pids.append(pid)
    deadline = time.monotonic() + STOP_WAIT_S
    while signum == signal.SIGSTOP and time.monotonic() < deadline:
        if all(_state(p) in ("T", "t", "Z", "X", "") for p in pids):
            break
        time.sleep(0.0005)
    print(" ".join(map(str, pids)))
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "worker":
        return worker(Path(argv[1]), argv[2])
    if len(argv) == 3 and argv[0] == "signal":
        return signal_all(argv[1], Path(argv[2]))
    print("usage: python -m crashbench.run.remote worker HOME NAME | signal SIG ROOT", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
