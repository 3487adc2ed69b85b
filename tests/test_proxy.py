"""The fault proxy byte by byte, against a TCP echo server in this process: what goes through intact
(a slow reader included), and what each toxic does to it, per direction, on connections opened before
the toxic too; and `crashbench bench --proxy`. tests/test_network.py has the toxics against a real
server and in real runs. Times are lower bounds, or far from the toxic's, so that a loaded machine
does not fail them."""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crashbench.control.proxyctl import ProxyProcess
from crashbench.control.sockmap import Sockmap
from crashbench.errors import RunAborted

# Real libraries, clusters, networks or installs: left out of the quick loop (make test-fast).
pytestmark = pytest.mark.slow


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP server that sends back what it receives and closes when its peer did; its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    threads: list[threading.Thread] = []

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threads.append(threading.Thread(target=serve, args=(conn,), daemon=True))
                threads[-1].start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield listener.getsockname()[1]
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    for t in [acceptor, *threads]:
        t.join(timeout=5)


@pytest.fixture(params=["kernel", "process"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which way the proxy forwards a connection while no toxic is on: through the kernel (a BPF
    sockmap, as root), or through its own process (everywhere; as root, with CRASHBENCH_PROXY_SOCKMAP=0).
    Every test of a toxic runs on both: a toxic switched on takes a connection off the kernel's path."""
    if request.param == "process":
        monkeypatch.setenv("CRASHBENCH_PROXY_SOCKMAP", "0")
        return "process"
    maps, why = Sockmap.open(capacity=2)
    if maps is None:
        pytest.skip(f"the proxy's kernel path needs root and BPF sockmaps: {why}")
    maps.close()
    return "kernel"


@pytest.fixture
def proxy(echo: int, tmp_path: Path, path: str) -> Iterator[ProxyProcess]:
    px = ProxyProcess([("127.0.0.1", echo)] * 2, tmp_path / "proxy.log")
    yield px
    px.close()


def connect(px: ProxyProcess, slot: int = 0) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", px.ports[slot]), timeout=2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def round_trip(sock: socket.socket, data: bytes) -> tuple[bytes, float]:
    started = time.monotonic()
    sock.sendall(data)
    got = b""
    while len(got) < len(data) and (chunk := sock.recv(65536)):
        got += chunk
    return got, time.monotonic() - started


def ended(sock: socket.socket) -> bool:
    """The connection was closed or reset by the proxy (not just silent)."""
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_megabytes_go_through_intact_to_a_reader_that_waits_first(proxy: ProxyProcess) -> None:
    """8 MB sent while nothing reads the answers: the proxy buffers what a socket does not take and
    stops reading the sender meanwhile, then everything arrives, in order."""
    payload = bytes(range(256)) * (8 * 4096)
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        time.sleep(0.3)  # the echo server's and the proxy's buffers fill up
        got = bytearray()
        while len(got) < len(payload) and (chunk := sock.recv(1 << 20)):
            got += chunk
        sender.join()
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


def test_each_path_is_the_one_the_proxy_says_it_takes(proxy: ProxyProcess, path: str, tmp_path: Path) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock, b"ping")[0] == b"ping"
    line = next(x for x in (tmp_path / "proxy.log").read_text().splitlines() if x.startswith("kernel forwarding"))
    want = "kernel forwarding: on" if path == "kernel" else "kernel forwarding: off (CRASHBENCH_PROXY_SOCKMAP=0)"
    assert line.startswith(want)


def test_a_toxic_switched_on_mid_stream_comes_after_what_went_before_in_order(proxy: ProxyProcess) -> None:
    """8 MB sent, the answers not read, and a toxic switched on meanwhile: what the kernel (or the
    proxy) had taken before the switch is still on its way while what comes after goes through the
    proxy's toxic; none of it overtakes the rest, none is lost."""
    payload = bytes(range(251)) * (8 * 4177)  # 251: a byte out of place shows
    with connect(proxy) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        time.sleep(0.3)  # the buffers fill up on both sides
        proxy.set([0], [{"name": "latency", "direction": "downstream", "latency": 1}])
        got = bytearray()
        while len(got) < len(payload) and (chunk := sock.recv(1 << 20)):
            got += chunk
        sender.join()
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
        proxy.set([0], [{"name": "latency", "direction": "downstream", "latency": 300}])
        assert round_trip(sock, b"ping")[1] >= 0.3


def test_latency_per_direction_applies_to_a_connection_already_open(proxy: ProxyProcess) -> None:
    with connect(proxy) as held, connect(proxy, 1) as other:
        assert round_trip(held, b"ping")[0] == b"ping"
        proxy.set([0], [{"name": "latency", "direction": "upstream", "latency": 400}])
        got, took = round_trip(held, b"ping")
        assert got == b"ping" and took >= 0.4
        assert round_trip(other, b"ping")[1] < 0.3  # the other slot is untouched
        proxy.set([0], [{"name": "latency", "direction": "downstream", "latency": 150, "jitter": 50}])
        assert round_trip(held, b"ping")[1] >= 0.1
        proxy.set([0], [])
        assert round_trip(held, b"ping")[1] < 0.3  # healed: straight through again


def test_bandwidth_and_slicer_pace_and_cut_the_chunks(proxy: ProxyProcess) -> None:
    with connect(proxy) as sock:
        proxy.set([0], [{"name": "bandwidth", "direction": "downstream", "rate": 100}])  # KB/s
        got, took = round_trip(sock, b"x" * 20480)
        assert len(got) == 20480 and took >= 0.18  # 20 KB at 100 KB/s: 0.2 s
        proxy.set([0], [{"name": "slicer", "direction": "downstream", "average_size": 10, "delay": 20_000}])
        started = time.monotonic()
        sock.sendall(b"y" * 100)
        chunks = []
        while sum(map(len, chunks)) < 100:
            chunks.append(sock.recv(1000))
        # Ten pieces 20 ms apart; a reader slower than that gets several at once.
        assert b"".join(chunks) == b"y" * 100 and len(chunks) > 1 and time.monotonic() - started >= 0.18


def test_limit_data_cuts_the_connection_once_the_bytes_went_through(proxy: ProxyProcess) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock, b"a" * 60)[0] == b"a" * 60  # counted although no toxic was on
        proxy.set([0], [{"name": "limit_data", "direction": "downstream", "bytes": 100}])
        sock.sendall(b"b" * 60)
        got = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1000):
                got += chunk
        assert got in (b"", b"b" * 40)  # at most the 40 bytes up to the limit, then the cut


def test_timeout_holds_a_connection_silent_then_resets_it(proxy: ProxyProcess) -> None:
    with connect(proxy) as held:
        assert round_trip(held, b"ping")[0] == b"ping"
        proxy.set([0], [{"name": "timeout", "timeout": 600}])
        held.settimeout(0.2)
        held.sendall(b"ping")
        with pytest.raises(TimeoutError):
            held.recv(10)  # half-open: nothing comes back, nothing closes
        held.settimeout(3)
        with pytest.raises(ConnectionResetError):
            held.recv(10)  # 0.6 s after the toxic came on


def test_down_resets_open_connections_refuses_new_ones_and_heals_on_the_same_port(proxy: ProxyProcess) -> None:
    port = proxy.ports[0]
    with connect(proxy) as held:
        assert round_trip(held, b"ping")[0] == b"ping"
        proxy.set([0], [{"name": "down"}])
        with pytest.raises(ConnectionResetError):
            round_trip(held, b"ping")
    with pytest.raises(ConnectionRefusedError):
        connect(proxy)
    proxy.set([0], [])
    with connect(proxy) as sock:
        assert sock.getpeername()[1] == port and round_trip(sock, b"ping")[0] == b"ping"


def connect_from(px: ProxyProcess, slot: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", px.ports[slot]), timeout=2, source_address=(source, 0))


def test_down_with_peers_cuts_those_sources_only_on_the_slots_told(proxy: ProxyProcess) -> None:
    """A cut between hosts by their source addresses (a cluster node bound to 127.0.0.K): open and new
    connections from the peers named are reset, others and other slots go on, and it heals."""
    with connect_from(proxy, 0, "127.0.0.9") as cut, connect_from(proxy, 0, "127.0.0.8") as kept:
        assert round_trip(cut, b"ping")[0] == b"ping" and round_trip(kept, b"ping")[0] == b"ping"
        proxy.set([0], [{"name": "down", "peers": ["127.0.0.9"]}])
        with pytest.raises(ConnectionResetError):
            round_trip(cut, b"ping")
        assert round_trip(kept, b"ping")[0] == b"ping"
    # Accepted (the port still listens for the others), then reset: seen by the connect itself, at times.
    with contextlib.suppress(ConnectionResetError), connect_from(proxy, 0, "127.0.0.9") as again:
        assert ended(again)
    with connect_from(proxy, 1, "127.0.0.9") as other_slot:
        assert round_trip(other_slot, b"ping")[0] == b"ping"
    proxy.set([0], [])
    with connect_from(proxy, 0, "127.0.0.9") as healed:
        assert round_trip(healed, b"ping")[0] == b"ping"
    with pytest.raises(RunAborted, match="peers must be a list"):
        proxy.set([0], [{"name": "down", "peers": "127.0.0.9"}])


def test_each_slot_forwards_to_its_own_target(echo: int, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # never listening: a slot in front of it resets at once
        px = ProxyProcess([("127.0.0.1", unused.getsockname()[1]), ("127.0.0.1", echo)], tmp_path / "proxy.log")
        try:
            with connect(px, 0) as refused, connect(px, 1) as echoed:
                assert ended(refused)
                assert round_trip(echoed, b"ping")[0] == b"ping"
        finally:
            px.close()


def test_reset_peer_sends_an_rst_and_an_end_of_file_closes_the_connection(proxy: ProxyProcess) -> None:
    with connect(proxy) as sock:
        assert round_trip(sock, b"ping")[0] == b"ping"
        sock.shutdown(socket.SHUT_WR)  # no half-closed connection: the proxy closes both sides
        assert ended(sock)
    proxy.set([1], [{"name": "reset_peer", "timeout": 50}])
    with connect(proxy, 1) as sock, pytest.raises(ConnectionResetError):
        sock.recv(10)  # 50 ms after it was made


def test_a_server_that_is_not_there_resets_the_worker_s_connection(tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, never listening: connections to it are refused
        px = ProxyProcess([("127.0.0.1", unused.getsockname()[1])], tmp_path / "proxy.log")
        try:
            with connect(px) as sock:
                assert ended(sock)
            with pytest.raises(RunAborted, match="refused"):
                px.set([3], [])  # no such slot: answered with an error, the proxy goes on
            px.set([0], [])
        finally:
            px.close()


def test_bench_proxy_measures_reliable_direct_and_through_the_proxy(tmp_path: Path) -> None:
    from tests.test_cli import crashbench

    args = ["--designs", "naive", "--workers", "1", "--jobs", "200", "--repeat", "1", "--memory-jobs", "0"]
    cp = crashbench("bench", *args, "--proxy", "--out", str(tmp_path), "--plain", tmp_path=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "network fault proxy, no toxic on" in cp.stdout and "through/direct" in cp.stdout
    (saved,) = tmp_path.glob("*-bench.json")
    data = json.loads(saved.read_text())
    assert data["settings"]["proxy"] is True
    assert [(c["design"], c["workers"], c["job_ms"], c["jobs"]) for c in data["proxy"]] == [
        ("reliable", 4, 0.0, 200),
        ("reliable", 4, 10.0, 20),
    ]
    for c in data["proxy"]:
        assert len(c["direct_samples"]) == len(c["through_samples"]) == 1 and c["through"]["median"] > 0
        assert c["ratio"] == pytest.approx(c["through"]["median"] / c["direct"]["median"], abs=1e-3)
