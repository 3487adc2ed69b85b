"""Real network partitions: each worker slot in its own Linux network namespace, faults as iptables rules.

A proxy (control/proxy.py) ends TCP in a process: it acknowledges the worker's segments whatever its toxics
do, so the worker's kernel never retransmits, keepalives are answered, TCP_USER_TIMEOUT never fires; and it
can drop only chunks of the stream, not packets TCP recovers. Here the kernel drops real packets:

    drop     every packet of the slot, both ways, silently: a partition. Neither side gets an error; a
             connection blocked in a read stays blocked until something times it out (a reply sent
             into the partition is retransmitted by TCP, and arrives late, once healed).
    reject   every TCP segment answered with an RST: ECONNRESET on an open connection at the next packet
             either side sends, ECONNREFUSED on a new one.
    loss     each packet dropped with a probability, each direction on its own: TCP retransmits, so the
             connection lives, with stalls of its retransmission timer.

Slot s gets namespace `cb-<tag>-<s>`, a veth pair (`cb-<tag>-<s>` on the host, `eth0` inside) and the /30
at 10.213.<k>.<4s> of the run's /24 (k from the tag, skipping /24s the host has addresses or routes in):
.4s+1 on the host (`host_address(s)`, where the server must listen: `bind_server`), .4s+2 inside, and no
other route. A worker moves itself in with `enter(s)`, forked, before it connects. Needs Linux, root,
`ip` and `iptables` (`unavailable()` says which is missing). Tags start with the owning pid: `sweep()`
removes what dead runs left (a SIGKILLed crashbench cleans nothing), and `Partitions.create` sweeps first.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

import psutil
import redis

from crashbench.errors import RunAborted

PREFIX = "cb-"
MAX_SLOTS = 64  # 64 /30s fill the run's /24
RULES = ("drop", "reject", "loss")
SUPERNET = ipaddress.ip_network("10.213.0.0/16")  # private, clear of Docker's and libvirt's defaults
NETNS_DIR = "/run/netns"
LOCK_PATH = "/run/crashbench-netns.lock"
CLONE_NEWNET = 0x40000000
TIMEOUT = 15.0  # seconds for one command: deleting 64 veths takes about 2 s
# pid, then up to two letters: "cb-<tag>-<slot>" must fit an interface name (15 characters). "z" is
# reserved for unavailable()'s probe, so that a probe killed half-way is swept like any run.
TAG = r"[0-9]{1,7}[a-y]{0,2}"
_tags = itertools.count()


class NetnsError(RunAborted):
    """A namespace, veth or iptables step failed, or this machine cannot (a RunAborted, like the proxy's)."""


class NetnsEnterError(OSError):
    """The calling process could not move into a slot's network namespace (raised in the worker)."""


def _run(args: list[str], stdin: str | None = None) -> str:
    """One command, no shell, bounded; its failure as a NetnsError naming the command and its stderr."""
    shown = " ".join(args)
    try:
        done = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except FileNotFoundError:
        raise NetnsError(f"{args[0]}: command not found") from None
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{shown}` did not finish within {TIMEOUT:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise NetnsError(f"`{shown}` failed: {said}" + (f"\n  its input:\n{stdin}" if stdin else ""))
    return done.stdout


def _iptables(*args: str, ns: str | None = None) -> str:
    command = ["iptables", "-w", "5", *args]  # -w: wait for iptables-legacy's lock, not fail at once
    return _run(["ip", "netns", "exec", ns, *command] if ns else command)


def unavailable() -> str | None:
    """None when this machine can make namespace partitions, else one sentence saying why not (cached)."""
    if not sys.platform.startswith("linux"):
        return f"network partitions need Linux network namespaces, not {sys.platform}."
    if os.geteuid() != 0:
        return "network partitions need root (network namespaces and iptables rules): run crashbench as root."
    if shutil.which("ip") is None:
        return "network partitions need the ip command: apt-get install iproute2."
    if shutil.which("iptables") is None:
        return "network partitions need the iptables command: apt-get install iptables."
    return _probe()


@functools.cache
def _probe() -> str | None:
    """Root is not enough in an unprivileged container: try a namespace, veth and iptables once (0.1 s)."""
    name = f"{PREFIX}{os.getpid()}z-0"
    try:
        _run(["ip", "netns", "add", name])
        _run(["ip", "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name])
        _iptables("-S", "INPUT")
        _iptables("-S", "INPUT", ns=name)
    except NetnsError as exc:
        first = exc.message.splitlines()[0]
        return f"cannot make a network namespace, veth and iptables rules here (an unprivileged container?): {first}"
    finally:
        _remove(f"{os.getpid()}z", PREFIX)
    return None


def new_tag() -> str:
    """A tag unique on this machine while this process lives: its pid, then a letter for a second one."""
    if (n := next(_tags)) > 25:
        raise NetnsError("more than 26 network partitions in one process")
    return f"{os.getpid()}{chr(96 + n) if n else ''}"


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host has an address in or a route to (the default route aside)."""
    used = [ipaddress.ip_interface(a).network for a in re.findall(r"\binet (\S+)", _run(["ip", "-4", "-o", "addr"]))]
    for line in _run(["ip", "-4", "route", "show", "table", "all"]).splitlines():
        words = [*line.split(), "default"]  # typed routes (local, broadcast, ...) name the type first
        with contextlib.suppress(ValueError, IndexError):  # "default" would overlap everything
            used.append(ipaddress.ip_network(words[words[0].isalpha()], strict=False))
    return [n for n in used if isinstance(n, ipaddress.IPv4Network)]


def _free_network(tag: str) -> ipaddress.IPv4Network:
    used, subnets, start = _used_networks(), list(SUPERNET.subnets(new_prefix=24)), zlib.crc32(tag.encode())
    for candidate in (subnets[(start + i) % 256] for i in range(256)):  # runs mostly start at different /24s
        if not any(candidate.overlaps(n) for n in used):
            return candidate
    raise NetnsError(f"no free /24 left in {SUPERNET} for the workers' namespaces (the host uses all 256)")


class Partitions:
    """One run's namespaces, veths and rules. `create` them, `close` them (idempotent)."""

    def __init__(self, tag: str, slots: int, network: ipaddress.IPv4Network) -> None:
        self.tag = tag
        self.slots = slots
        self.network = network
        self.chain = f"{PREFIX}{tag}"
        self.applied: dict[int, list[str]] = {}  # slot -> its rule's match on the host, to delete it by spec
        self.closed = False

    @classmethod
    def create(cls, slots: int, tag: str | None = None) -> Partitions:
        """`slots` namespaces, ready for workers to enter. `tag`: the owning process's pid first, then at
        most two letters a-y (new_tag()); the names must not exist yet."""
        if (reason := unavailable()) is not None:
            raise NetnsError(reason)
        tag = tag if tag is not None else new_tag()
        if not re.fullmatch(TAG, tag):
            raise NetnsError(f"bad tag {tag!r}: a pid, then at most two letters a-y")
        if not 1 <= slots <= MAX_SLOTS:
            raise NetnsError(f"{slots} worker slots: network partitions handle 1 to {MAX_SLOTS}")
        with open(LOCK_PATH, "a") as lock:  # concurrent runs check and take their /24 one at a time
            fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file
            with contextlib.suppress(NetnsError):  # a dead run's leftover does not keep this one from running
                _sweep(PREFIX)
            names = [n for names in _names(PREFIX)[0].values() for n in names]  # a clash fails before _build,
            if any(re.fullmatch(rf"{PREFIX}{tag}(-[0-9]+)?", n) for n in names):  # whose failure removes them
                raise NetnsError(f"network partitions {tag} exist already: give another tag (new_tag())")
            self = cls(tag, slots, _free_network(tag))
            try:
                self._build()
            except BaseException:
                with contextlib.suppress(NetnsError):
                    self.close()
                raise
        return self

    def _build(self) -> None:
        # One `ip -batch` for the host's side of all slots, one per namespace: 64 slots in about 0.4 s.
        host = []
        for s in range(self.slots):
            name = self.namespace(s)
            host += [f"netns add {name}", f"link add {name} type veth peer name eth0 netns {name}"]
            host += [f"addr add {self.host_address(s)}/30 dev {name}", f"link set {name} up"]
        _run(["ip", "-batch", "-"], "\n".join(host) + "\n")
        for s in range(self.slots):
            inside = f"addr add {self.worker_address(s)}/30 dev eth0\nlink set eth0 up\nlink set lo up\n"
            _run(["ip", "-n", self.namespace(s), "-batch", "-"], inside)
        # The host's chain, for packets to the run's /24: the faults' rules (inserted on top); the host's
        # own go on to the host's rules; any other is dropped (the server's protected mode is off, and the
        # LAN could reach these addresses); the namespaces' accepted, so no host firewall partitions them.
        _iptables("-N", self.chain)
        _iptables("-A", self.chain, "-i", "lo", "-j", "RETURN")
        _iptables("-A", self.chain, "!", "-i", f"{self.chain}-+", "-j", "DROP")
        _iptables("-A", self.chain, "-j", "ACCEPT")
        _iptables("-I", "INPUT", "1", "-d", str(self.network), "-j", self.chain)

    def namespace(self, slot: int) -> str:
        """The slot's namespace, also the name of its veth on the host (`ip netns exec <name> ...`)."""
        self._check(slot)
        return f"{self.chain}-{slot}"

    def host_address(self, slot: int) -> str:
        """The host's end of the slot's veth: the server must listen here; workers in the slot connect here."""
        self._check(slot)
        return str(self.network[4 * slot + 1])

    def worker_address(self, slot: int) -> str:
        """The slot's end inside its namespace: the workers' source address."""
        self._check(slot)
        return str(self.network[4 * slot + 2])

    @property
    def host_addresses(self) -> list[str]:  # for bind_server
        return [self.host_address(s) for s in range(self.slots)]

    def worker_url(self, url: str, slot: int) -> str:
        """`url` (the run's redis://host:port/db) for a worker in the slot: the host replaced by host_address."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss") or parts.port is None:
            raise NetnsError(f"network partitions need a TCP server URL with a port (redis://host:port), not {url!r}")
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth + '@' if auth else ''}{self.host_address(slot)}:{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def enter(self, slot: int) -> None:
        """Move the calling process into the slot's namespace: in the forked worker, before it connects."""
        enter_namespace(self.namespace(slot))

    def apply(self, slot: int, rule: str, probability: float = 0.0) -> None:
        """Put `rule` on the slot (replacing the one it had): "drop", "reject", or "loss" with
        `probability` (0 < p <= 1) per packet and direction."""
        self._check(slot)
        if rule not in RULES:
            raise NetnsError(f"unknown rule {rule!r}: one of {', '.join(RULES)}")
        if (rule == "loss" and not 0 < probability <= 1) or (rule != "loss" and probability):
            raise NetnsError(f"{rule} with probability {probability}: loss needs 0 < p <= 1, the others none")
        if rule == "drop":
            match = ["-j", "DROP"]
        elif rule == "reject":
            # Never an RST for an RST: the host's RST to the worker crosses the namespace's INPUT (and
            # the server's the host's), and a REJECT there would swallow it, leaving the sender silent.
            match = ["-p", "tcp", "!", "--tcp-flags", "RST", "RST", "-j", "REJECT", "--reject-with", "tcp-reset"]
        else:
            match = ["-m", "statistic", "--mode", "random", "--probability", f"{probability:.6f}", "-j", "DROP"]
        self.heal(slot)
        # Each side's INPUT, not OUTPUT: a packet dropped in OUTPUT fails its sender's send() with EPERM,
        # an error no real network gives; dropped on arrival, both ends see silence, as in a partition.
        self.applied[slot] = match
        _iptables("-I", self.chain, "1", "-i", self.namespace(slot), *match)
        _iptables("-A", "INPUT", *match, ns=self.namespace(slot))

    def heal(self, slot: int) -> None:
        """Remove the slot's rule (nothing if it has none): packets flow again; TCP retransmits what was lost."""
        if (match := self.applied.pop(slot, None)) is not None:
            with contextlib.suppress(NetnsError):  # either side may be missing if apply failed half-way
                _iptables("-D", self.chain, "-i", self.namespace(slot), *match)
            with contextlib.suppress(NetnsError):  # by its spec: the hosts' cuts between them stay
                _iptables("-D", "INPUT", *match, ns=self.namespace(slot))

    def close(self) -> None:
        """Delete every namespace, veth and iptables rule and chain of this run; again, it does nothing.
        A worker still inside a namespace loses its link at once (its veth is deleted)."""
        if self.closed:
            return
        self.closed = True
        self.applied.clear()
        if problems := _remove(self.tag, PREFIX):
            raise NetnsError(f"could not remove all of network partitions {self.tag}: " + "; ".join(problems))

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise NetnsError(f"no slot {slot}: network partitions {self.tag} have slots 0 to {self.slots - 1}")
        if self.closed:
            raise NetnsError(f"network partitions {self.tag} are closed")


def enter_namespace(name: str) -> None:
    """setns(2) into /run/netns/<name> (Python 3.11 has no os.setns). Only the calling thread moves and
    sockets made before keep their namespace: call it first thing in a forked child."""
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise NetnsEnterError(exc.errno, f"cannot open network namespace {name}: {exc.strerror}", path) from None
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsEnterError(err, f"cannot enter network namespace {name}: {os.strerror(err)}", path)
    finally:
        os.close(fd)


def _names(prefix: str) -> tuple[dict[str, list[str]], list[str]]:
    """Namespaces, links and host chains named `prefix`..., INPUT's and FORWARD's jumps (as `-S` prints
    them; FORWARD's: crashbench.faults.hosts.links); and the
    listings that failed (an iptables that cannot run has no rules of ours, the rest is still removed)."""
    found: dict[str, list[str]] = {"netns": [], "link": [], "chain": [], "jump": []}
    problems = []
    try:
        found["netns"] = [line.split()[0] for line in _run(["ip", "netns", "list"]).splitlines() if line.strip()]
        found["link"] = re.findall(r"^[0-9]+: ([^:@\s]+)", _run(["ip", "-o", "link", "show"]), re.M)
        rules = _iptables("-S").splitlines()
        found["chain"] = [line.split()[1] for line in rules if line.startswith("-N ")]
        found["jump"] = [line for line in rules if line.startswith(("-A INPUT ", "-A FORWARD ")) and " -j " in line]
    except NetnsError as exc:
        problems.append(exc.message)
    return {k: [n for n in v if k == "jump" or n.startswith(prefix)] for k, v in found.items()}, problems


def _remove(tag: str, prefix: str) -> list[str]:
    """Everything named for `tag`, in the order that never leaves a rule pointing nowhere: INPUT's jump,
    the chain, the veths (which also takes a worker still inside off the network), the namespaces.
    Returns what failed."""
    found, problems = _names(prefix)
    chain = f"{prefix}{tag}"
    # `-S` prints a rule as `-A INPUT <spec>`, and `-D INPUT <spec>` deletes that rule.
    steps = [["-D", *jump.split()[1:]] for jump in found["jump"] if jump.split()[-1] == chain]
    steps += [["-F", chain], ["-X", chain]] if chain in found["chain"] else []
    for step in steps:
        try:
            _iptables(*step)
        except NetnsError as exc:
            problems.append(exc.message)
    mine = re.compile(rf"{re.escape(chain)}-[0-9]+")
    batch = [f"link del {n}" for n in found["link"] if mine.fullmatch(n)]
    batch += [f"netns del {n}" for n in found["netns"] if mine.fullmatch(n)]
    if batch:
        try:  # -force: carry on past a failure, so that one stuck name does not keep the rest
            _run(["ip", "-force", "-batch", "-"], "\n".join(batch) + "\n")
        except NetnsError as exc:
            problems.append(exc.message)
    return problems


def _owner_alive(tag: str, created: float | None) -> bool:
    """Whether the process the tag names still runs: its pid lives and started before the namespace
    (a pid reused since then is someone else)."""
    pid = int(tag.rstrip("abcdefghijklmnopqrstuvwxyz"))
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return False
    return created is None or started <= created + 1


def sweep(tag_prefix: str = PREFIX) -> list[str]:
    """Remove the namespaces, veths and chains of runs whose process is gone; return their tags. Never
    touches another name, nor a live run's. Under the lock runs take their /24 with: two sweeps at once
    both removed the same dead run's names, and the second failed on the names the first had taken."""
    if unavailable() is not None:
        return []  # nothing can have been made here either
    with open(LOCK_PATH, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file
        return _sweep(tag_prefix)


def _sweep(tag_prefix: str) -> list[str]:
    found, problems = _names(tag_prefix)
    pattern = re.compile(rf"{re.escape(tag_prefix)}({TAG}|[0-9]{{1,7}}z)(?:-[0-9]+)?")
    born: dict[str, float | None] = {}
    for name in (*found["link"], *found["chain"], *found["netns"]):  # namespaces last: their birth counts
        if m := pattern.fullmatch(name):
            born[m[1]] = None
            with contextlib.suppress(OSError):  # a namespace's nsfs file has its birth time
                born[m[1]] = os.stat(os.path.join(NETNS_DIR, name)).st_mtime
    dead = sorted(t for t, when in born.items() if not _owner_alive(t, when))
    problems += [p for t in dead for p in _remove(t, tag_prefix)]
    if problems:
        raise NetnsError("could not remove all of dead runs' network partitions: " + "; ".join(problems))
    return dead


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True, socket_timeout=10, socket_connect_timeout=5)


def bind_server(url: str, addresses: Iterable[str]) -> dict[str, str]:
    """Make the server at `url` (on this host) also listen on `addresses` (Partitions.host_addresses),
    with protected mode off (else it answers DENIED to any client not on loopback); returns the settings
    it had, for restore_server. Needs Redis >= 7 or Valkey (CONFIG SET bind); an embedded server that
    restarts (broker faults) forgets it: bind it again after the restart."""
    try:
        with _client(url) as client:
            before = {k: str(client.config_get(k).get(k, "")) for k in ("bind", "protected-mode")}
            bound = before["bind"].split()
            if not {"*", "0.0.0.0"} & set(bound):
                client.config_set("bind", " ".join([*bound, *(a for a in addresses if a not in bound)]))
            client.config_set("protected-mode", "no")
    except redis.RedisError as exc:
        raise NetnsError(
            f"cannot make the server listen on the workers' namespace addresses: {exc}",
            hint="network partitions need Redis >= 7 or Valkey; or start the server with "
            "--bind '127.0.0.1 <addresses>' --protected-mode no",
        ) from None
    return before


def restore_server(url: str, before: dict[str, str]) -> None:
    """Put back what bind_server changed (`before`: its answer)."""
    try:
        with _client(url) as client:
            client.config_set("bind", before["bind"])
            client.config_set("protected-mode", before["protected-mode"])
    except redis.RedisError as exc:
        raise NetnsError(f"cannot restore the server's bind and protected-mode: {exc}") from None
