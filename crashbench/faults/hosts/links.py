"""The network between the hosts (crashbench.faults.hosts), and its cuts.

Each host is one slot of the run's Partitions (crashbench.faults.netns): a namespace whose only link is a
veth to this machine, where the server listens. `route` lets the hosts reach each other through this
machine, as machines on one LAN do: in each namespace a route to the run's /24 via its veth's far end,
forwarding on the host-side veths alone (net.ipv4.conf.<veth>.forwarding, gone with the veth; the
machine's own ip_forward is left as it is), and FORWARD's packets to the /24 sent through the run's chain,
whose last rule accepts them (a FORWARD policy of DROP, as Docker sets, would cut every host off) and whose
fault rules, a host cut off from the server, drop its forwarded packets too. netns's sweep and close
remove that jump with the chain.

`Cuts` drops every packet between a host and some others, both ways, on arrival (each namespace's INPUT,
by source address), as netns's "drop" does for the server: neither side gets an error, and each still
reaches the server. Each rule is deleted by its spec when healed, so a cut of another host, or a cut
from the server, in the same namespace stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from crashbench.faults import netns
from crashbench.faults.netns import _iptables, _run  # the one place commands are run, bounded


def route(net: netns.Partitions) -> None:
    """Let every slot of `net` reach every other through this machine."""
    for s in range(net.slots):
        _run(["ip", "-n", net.namespace(s), "route", "add", str(net.network), "via", net.host_address(s)])
        try:
            with open(f"/proc/sys/net/ipv4/conf/{net.namespace(s)}/forwarding", "w") as f:
                f.write("1")
        except OSError as exc:
            raise netns.NetnsError(f"cannot let host {s}'s packets through to the other hosts: {exc}") from None
    _iptables("-I", "FORWARD", "1", "-d", str(net.network), "-j", net.chain)


class Cuts:
    """The run's cuts between hosts: per host cut off by a fault, the (namespace slot, source slot) of
    each DROP rule it put."""

    def __init__(self, net: netns.Partitions) -> None:
        self.net = net
        self.made: dict[int, list[tuple[int, int]]] = {}

    def _rule(self, op: str, ns: int, source: int) -> None:
        _iptables(op, "INPUT", "-s", self.net.worker_address(source), "-j", "DROP", ns=self.net.namespace(ns))

    def cut(self, host: int, others: Sequence[int]) -> None:
        """Drop every packet between `host` and each of `others`, both ways (replacing its cut)."""
        self.heal(host)
        made = self.made[host] = []
        for other in others:
            for ns, source in ((host, other), (other, host)):
                self._rule("-A", ns, source)
                made.append((ns, source))

    def heal(self, host: int) -> None:
        """Remove `host`'s cut (nothing if it has none)."""
        for ns, source in self.made.pop(host, []):
            self._rule("-D", ns, source)
