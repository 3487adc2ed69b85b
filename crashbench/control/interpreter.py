"""Workers under another Python interpreter (`--worker-python PATH`).

Some libraries cannot share crashbench's environment (arq pins redis-py < 6), and a user may want
their application's exact versions; some workers must start in a fresh interpreter (gevent's monkey
patching comes before any import of socket: Design.worker_module, under crashbench's own interpreter
when no other is given). Then each forked worker execs `PATH -m crashbench.run.worker`
instead of running the worker body in the forked copy: it stays the same process (same pid, same
session, the same die-with-parent flag), so the supervisor's identity and kill rules still hold;
only its start-up is a cold interpreter's.

The other interpreter imports crashbench from this installation through a directory that holds
nothing but a link to the package, so none of crashbench's own dependencies shadow the other
environment's (its redis-py stays its own). It needs redis-py, and whatever the design's library is.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from crashbench.errors import UsageError

# How an exec'd worker gets the server's real URL (read by crashbench.run.worker.main): argv is visible
# to every user in `ps`, and the spec file stays in a kept run directory; the environment is the
# process's own. The same name as the CLI's variable, so a user's shell and a worker read alike.
URL_ENV = "CRASHBENCH_REDIS_URL"
# Where an exec'd worker appends its wall and monotonic clocks at start (crashbench.faults.clock): set only
# for a worker whose clock a fault skews.
CLOCK_PROBE_ENV = "CRASHBENCH_CLOCK_PROBE"

CHECK_TIMEOUT = 60.0
WORKER_MODULE = "crashbench.run.worker"  # what an exec'd worker runs, unless its design names its own


class WorkerPython:
    """`python`: the interpreter; `path_dir`: an empty directory of the caller's, for the link."""

    def __init__(self, python: str, path_dir: Path) -> None:
        self.python = python
        self.path_dir = path_dir
        # The server's URL, once the session knows it: handed to workers through their environment
        # (crashbench.run.worker.URL_ENV), because argv is public in `ps` and may carry a password.
        self.redis_url: str | None = None
        # The package itself (this module is crashbench/control/interpreter.py), wherever it is installed.
        package = Path(__file__).resolve().parent.parent
        (path_dir / "crashbench").symlink_to(package, target_is_directory=True)

    def env(self, redis_url: str | None = None) -> dict[str, str]:
        """`redis_url`: this worker's own (through the network fault proxy), else the run's."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.path_dir), env.get("PYTHONPATH", "")) if p)
        if redis_url or self.redis_url:
            env[URL_ENV] = redis_url or self.redis_url  # type: ignore[assignment]
        return env

    def argv(self, *args: str, module: str = WORKER_MODULE) -> list[str]:
        """The worker's command line: paths and names only, never the URL (see env). `module`: the
        design's own entry (Design.worker_module), which runs crashbench.run.worker's main."""
        return [self.python, "-m", module, *args]

    def check(self, modules: list[str]) -> dict[str, str]:
        """Fail now, with the interpreter's own message, if it cannot run a worker of these designs;
        else return its versions of Python, redis-py and the libraries, for the result."""
        wanted = ["redis", *modules]
        code = "; ".join(
            [
                "import json, sys, importlib.metadata as md",
                *(f"import {m}" for m in [WORKER_MODULE, *wanted]),
                f"print(json.dumps({{'python': sys.version.split()[0], **{{m: md.version(m) for m in {wanted!r}}}}}))",
            ]
        )
        try:
            done = subprocess.run(
                [self.python, "-c", code], env=self.env(), capture_output=True, text=True, timeout=CHECK_TIMEOUT
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UsageError(f"--worker-python {self.python}: cannot run it ({exc})") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UsageError(
                f"--worker-python {self.python} cannot run a crashbench worker: {last}",
                hint=f"install what it lacks into that environment (needs: {', '.join(wanted)})",
            )
        try:
            return {str(k): str(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
        except (ValueError, IndexError, AttributeError):  # it exited 0 without running the check
            raise UsageError(
                f"--worker-python {self.python} is not a Python interpreter: it did not answer the version check",
                hint="give the python of the environment that has the design's library (e.g. venv/bin/python)",
            ) from None
