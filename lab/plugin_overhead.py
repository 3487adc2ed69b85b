"""What the pytest plugin costs: the same small crash run (reliable, 300 jobs of 10 ms, 4 workers, 2
mid-job SIGKILLs, its result saved and its HTML report written) as one pytest test using the
crashbench fixture and as `crashbench run --html`, each a fresh process, N times interleaved (5 by
default): pytest with every plugin installed here, and with crashbench's alone. Then in one process,
the core imported, the fixture's run() as the test timed it against the core's own calls
(run_designs, Result.write, the HTML report). Prints the medians, each ratio to `crashbench run` and
the difference. Not a timed test: a measurement (make plugin-overhead).

    python lab/plugin_overhead.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from crashbench import scenario as scenarios
from crashbench.report import html
from crashbench.run.session import Options, run_designs

SETTINGS = {"jobs": 300, "kills": 2, "interval": 0.1, "stale_after": 0.3, "recover_every": 0.05}
TEST = """
import pathlib, time

import crashbench.report.html, crashbench.run.session  # imported before the clock starts, as here

def test_overhead(crashbench):
    t = time.perf_counter()
    result = crashbench.run(design="reliable", {settings})
    pathlib.Path({timing!r}).open("a").write(f"{{time.perf_counter() - t}}\\n")
    result.assert_valid()
"""


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    cp = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - t
    if cp.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {cp.returncode}:\n{cp.stdout}{cp.stderr}")
    return elapsed


def in_process(directory: Path) -> float:
    """The core's calls the fixture makes, without pytest: a run, its result saved, its report written."""
    t = time.perf_counter()
    result = run_designs(scenarios.with_overrides(scenarios.load(None), **SETTINGS), ["reliable"], Options())
    path = result.write(directory)
    html.write(result, [r.timeline for r in result.runs if r.timeline is not None], path.with_suffix(".html"))
    return time.perf_counter() - t


def ms(seconds: float) -> str:
    return f"{seconds * 1000:7.0f} ms"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory(prefix="plugin-overhead-") as tmp:
        work = Path(tmp)
        timing = work / "fixture.txt"
        settings = ", ".join(f"{k}={v!r}" for k, v in SETTINGS.items())
        (work / "test_overhead.py").write_text(TEST.format(settings=settings, timing=str(timing)))
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
        pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", str(work / "pt")]
        cli_cmd = [str(bin_dir / "crashbench"), "run", "-d", "reliable", *flags, "--plain", "--out", str(work / "cli")]
        # Every pytest plugin installed here (hypothesis alone takes 0.6 s to import), and crashbench's
        # alone: what a user of `pip install 'crashbench[pytest]'` and nothing else would start.
        alone = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        pytest_s, alone_s, cli_s, api_s = [], [], [], []
        for i in range(n):  # interleaved: a slow moment of the machine hits each alike
            pytest_s.append(timed(pytest_cmd, work))
            alone_s.append(timed([*pytest_cmd, "-p", "crashbench.pytest_plugin"], work, alone))
            cli_s.append(timed([*cli_cmd, "--html", str(work / f"cli-{i}.html")], work))
            api_s.append(in_process(work / "api"))
        fixture_s = [float(line) for line in timing.read_text().split()]
    p, b, c = statistics.median(pytest_s), statistics.median(alone_s), statistics.median(cli_s)
    f, a = statistics.median(fixture_s), statistics.median(api_s)
    print(f"reliable, {', '.join(f'{k}={v}' for k, v in SETTINGS.items())}; median of {n}")
    print(f"  crashbench run --html (process)              {ms(c)}")
    print(f"  pytest, a test using the fixture (process)   {ms(p)}   ratio {p / c:.2f}x, {(p - c) * 1000:+.0f} ms")
    print(f"  ... crashbench's the only pytest plugin      {ms(b)}   ratio {b / c:.2f}x, {(b - c) * 1000:+.0f} ms")
    print(f"  run_designs + write + report (in process)    {ms(a)}")
    print(f"  the fixture's run() (in the test's process)  {ms(f)}   ratio {f / a:.2f}x, {(f - a) * 1000:+.0f} ms")


if __name__ == "__main__":
    main()
