"""The local half of a worker on a host over SSH: a process the supervisor forks and waits for as for any
worker, whose life mirrors the remote worker's. It

- connects (crashbench.control.ssh), writes the worker's spec into its directory on the host, and starts
  `python -m crashbench.run.remote worker` there, the server's URL on its stdin (never on a command line);
- measures the host's clock against this one (the round trip of a line to the remote worker, the fastest
  of PROBES) and tells the worker, whose clock is then its host's less that offset
  (crashbench.model.hostclock): its ledger and the times its design stores in Redis (heartbeats, leases)
  are on the harness's clock, as a local worker's are;
- brings the ledger back over SFTP as it grows, into the local ledger file the harness reads (never
  through Redis): READY, the starts, the ends, as for a local worker, a poll later;
- takes the supervisor's signals on a Unix socket (`signal_remote`) and sends them over the same
  connection (`kill`); a SIGSTOP is answered once the host's kernel reports the worker stopped and its
  ledger is read to the end, so a frozen worker's ledger is final here as it is locally;
- when the remote worker ends, reads its ledger to the end, removes its directory, and ends the same way:
  killed by the same signal, or with the same exit code.

If this process dies (crashbench with it), the connection closes; the remote worker sees its parent
(the SSH server's session) go, stops, and removes its own directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crashbench.control.ssh import SshTarget, connect, quote

POLL_S = 0.005  # how often the remote ledger is read
PROBES = 5
READ_MAX = 256 * 1024
STOP_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class RemoteSlot:
    """Where a slot's workers run: the host, and the run's directory on it (the zip of crashbench in it)."""

    target: SshTarget
    root: str


class Stub:
    def __init__(self, slot: RemoteSlot, name: str, spec: str, url: str, ledger: Path, control: Path) -> None:
        self.slot, self.name, self.spec, self.url = slot, name, spec, url
        self.home = f"{slot.root}/{name}"
        self.control = control
        self.out = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.offset, self.pos, self.rest = 0.0, 0, b""
        self.pid = 0
        self.file: Any = None

    async def main(self) -> tuple[int | None, int]:
        """(the signal the remote worker died of, or None; its exit code)."""
        self.known = asyncio.Event()  # the remote worker's pid is known (or it never started)
        conn = await connect(self.slot.target)
        try:
            async with conn.start_sftp_client() as sftp:
                self.conn, self.sftp = conn, sftp
                await sftp.mkdir(self.home)
                async with sftp.open(f"{self.home}/spec.json", "w") as f:
                    await f.write(self.spec)
                server = await asyncio.start_unix_server(self._signal, path=str(self.control))
                try:
                    return await self._run()
                finally:
                    self.known.set()
                    server.close()
                    await self._sync()
                    with contextlib.suppress(Exception):
                        await conn.run(f"rm -rf {quote(self.home)}", check=False)
        finally:
            conn.close()
            with contextlib.suppress(OSError):
                self.control.unlink()

    async def _run(self) -> tuple[int | None, int]:
        t, zip_ = self.slot.target, f"{self.slot.root}/crashbench.zip"
        proc = await self.conn.create_process(
            f"cd {quote(self.home)} && exec env PYTHONPATH={quote(zip_)} "
            f"{quote(t.python, '-m', 'crashbench.run.remote', 'worker', self.home, self.name)}"
        )
        errors = asyncio.create_task(self._copy(proc.stderr))
        proc.stdin.write(self.url + "\n")
        first = await proc.stdout.readline()
        if first.strip().isdigit():
            self.pid = int(first)
            self.known.set()
            await self._probe(proc)
        else:
            self.known.set()
            proc.stdin.write_eof()
        closed = asyncio.create_task(proc.wait_closed())
        while not closed.done():
            await self._sync()
            await asyncio.wait([closed], timeout=POLL_S)
        await errors
        sig = proc.exit_signal[0] if proc.exit_signal else None
        signum = getattr(signal.Signals, "SIG" + sig, None) if sig else None
        return (int(signum) if signum else None), (proc.exit_status if proc.exit_status is not None else 1)

    async def _probe(self, proc: Any) -> None:
        best = None
        for _ in range(PROBES):
            t0 = time.monotonic()
            proc.stdin.write("\n")
            line = await proc.stdout.readline()
            t1 = time.monotonic()
            with contextlib.suppress(ValueError):
                if best is None or t1 - t0 < best[0]:
                    best = (t1 - t0, float(line) - (t0 + t1) / 2)
        if best is not None:
            self.offset = best[1]
        proc.stdin.write(f"go {self.offset!r}\n")  # the worker's clock: its host's less this offset
        if best is not None:
            print(f"crashbench: {self.slot.target} clock offset {best[1] * 1000:+.3f} ms "
                  f"(round trip {best[0] * 1000:.3f} ms)", file=sys.stderr)  # fmt: skip

    async def _copy(self, stream: Any) -> None:
        async for line in stream:
            sys.stderr.write(line)
        sys.stderr.flush()

    async def _sync(self) -> None:
        """Whatever the remote ledger has that this one does not yet, whole lines, on this clock."""
        if self.file is None:
            try:
                self.file = await self.sftp.open(f"{self.home}/ledger", "rb")
            except Exception:  # not yet there (the worker has not started), or gone
                return
        while True:
            data = await self.file.read(READ_MAX, self.pos)
            if not data:
                return
            self.pos += len(data)
            buf = self.rest + data
            cut = buf.rfind(b"\n") + 1
            whole, self.rest = buf[:cut], buf[cut:]
            if whole:
                os.write(self.out, whole)

    async def _signal(self, reader: Any, writer: Any) -> None:
        line = (await reader.readline()).split()
        try:
            signum, whole = int(line[0]), line[1] == b"1"
            await self.known.wait()  # a signal sent as the worker starts is for it, once it is there
            if self.pid:
                who = f"-- -{self.pid}" if whole else str(self.pid)
                await self.conn.run(f"kill -s {signal.Signals(signum).name[3:]} {who}", check=False)
                if signum == signal.SIGSTOP:
                    await self._stopped()
                    await self._sync()
            writer.write(b"ok\n")
            await writer.drain()
        finally:
            writer.close()

    async def _stopped(self) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < deadline:
            try:
                async with self.sftp.open(f"/proc/{self.pid}/stat", "rb") as f:
                    state = (await f.read(4096)).rsplit(b")", 1)[1].split()[0]
            except Exception:
                return  # gone
            if state in (b"T", b"t", b"Z", b"X"):
                return
            await asyncio.sleep(0.0005)


def run(slot: RemoteSlot, name: str, spec: str, url: str, ledger: Path, control: Path) -> int:
    """The stub's body, in the forked process: ends as the remote worker ended."""
    signum, code = asyncio.run(Stub(slot, name, spec, url, ledger, control).main())
    if signum is not None:
        sys.stderr.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        if signum == signal.SIGSTOP:
            os.kill(os.getpid(), signal.SIGKILL)
    return code


def signal_remote(control: Path, signum: int, whole: bool, alive: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Ask the stub listening at `control` to send `signum` to its remote worker (its process group with
    `whole`), and wait until it did; False when no stub answers (gone, or `alive()` says it is)."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(control))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if not alive() or time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
    with s:
        try:
            s.sendall(b"%d %d\n" % (signum, int(whole)))
            return s.recv(8).startswith(b"ok")
        except OSError:
            return False
