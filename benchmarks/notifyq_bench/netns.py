"""Worker "hosts" for the ``multihost`` scenario: Linux network namespaces, each joined to a
bridge in this namespace by a veth pair, so that their traffic to PostgreSQL crosses a real
(virtual) network link that the bench can cut and heal.

Everything is named after this process's pid (``notifyq-bench-<pid>-h<n>``, bridge
``nqb<pid>``, veths ``nqv<pid>h<n>``), so that :func:`drop_stale` can remove what an earlier,
killed run left and nothing else. Needs root and ``ip`` (iproute2). Traffic only ever goes
between these namespaces and this one's bridge address: the subnet is private to the bench.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from notifyq_bench.harness import BenchError, alive

NS_PREFIX = "notifyq-bench-"
BRIDGE_PREFIX = "nqb"
VETH_PREFIX = "nqv"
#: The bench's subnets are 10.213.<k>.0/24 with k from the pid, the server on .1, host n on .10+n.
SUBNET_BASE = "10.213"


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"ip netns does not work here: {probe.stderr.strip()}"
    return None


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and result.returncode != 0:
        raise BenchError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def drop_stale() -> list[str]:
    """Removes the namespaces and bridges of earlier runs whose process is gone."""
    dropped: list[str] = []
    listing = ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        match = re.fullmatch(rf"{re.escape(NS_PREFIX)}(\d+)-h\d+", name)
        if match and int(match.group(1)) != os.getpid() and not alive(int(match.group(1))):
            ip("netns", "delete", name, check=False)
            dropped.append(name)
    links = ip("-o", "link", "show", "type", "bridge", check=False).stdout
    for match in re.finditer(rf"^\d+: ({BRIDGE_PREFIX}(\d+))[:@]", links, re.MULTILINE):
        if int(match.group(2)) != os.getpid() and not alive(int(match.group(2))):
            ip("link", "delete", match.group(1), check=False)
            dropped.append(match.group(1))
    return dropped


@dataclass
class Host:
    """One namespace: its name, its address, and the host-side end of its link."""

    index: int
    namespace: str
    address: str
    veth: str
    up: bool = True

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec`` execs it: same pid)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


@dataclass
class Network:
    """A bridge with the server's address and ``hosts`` namespaces on it. Use as a context
    manager, or call :meth:`close` in a ``finally``: it removes everything it made."""

    hosts_wanted: int
    hosts: list[Host] = field(default_factory=list)
    bridge: str = ""
    server_address: str = ""
    subnet: str = ""
    _made_bridge: bool = False

    def __enter__(self) -> Network:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        pid = os.getpid()
        octet = pid % 250 + 1
        self.subnet = f"{SUBNET_BASE}.{octet}.0/24"
        used = ip("-o", "-4", "addr", "show", check=False).stdout
        if f" {SUBNET_BASE}.{octet}." in used:
            raise BenchError(f"the subnet {self.subnet} is in use here; run the bench again")
        self.bridge = f"{BRIDGE_PREFIX}{pid}"
        self.server_address = f"{SUBNET_BASE}.{octet}.1"
        ip("link", "add", self.bridge, "type", "bridge", "stp_state", "0")
        self._made_bridge = True
        ip("addr", "add", f"{self.server_address}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for index in range(self.hosts_wanted):
            self.add_host(index)

    def add_host(self, index: int) -> Host:
        pid = os.getpid()
        octet = self.server_address.split(".")[2]
        host = Host(
            index=index,
            namespace=f"{NS_PREFIX}{pid}-h{index}",
            address=f"{SUBNET_BASE}.{octet}.{10 + index}",
            veth=f"{VETH_PREFIX}{pid}h{index}",
        )
        ip("netns", "add", host.namespace)
        self.hosts.append(host)  # from here on, close() removes it
        peer = f"{host.veth}p"
        ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", host.namespace)
        ns = ["-n", host.namespace]
        ip(*ns, "link", "set", peer, "name", "eth0")
        ip(*ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip(*ns, "link", "set", "lo", "up")
        ip(*ns, "link", "set", "eth0", "up")
        ip("link", "set", host.veth, "master", self.bridge)
        ip("link", "set", host.veth, "up")
        return host

    def add_delay(self, one_way_ms: float) -> str | None:
        """Delays every packet by ``one_way_ms`` at both ends of each host's link (netem on the
        bridge's veth and on the host's eth0), or says why it could not (most often: the
        kernel has no netem) and leaves the links bare."""
        if shutil.which("tc") is None:
            return "the tc command (iproute2) is not installed"
        delay = f"{one_way_ms * 1000:.1f}us"
        done: list[list[str]] = []
        for host in self.hosts:
            for where in (["tc"], host.command(["tc"])):
                dev = host.veth if where == ["tc"] else "eth0"
                result = subprocess.run(
                    [*where, "qdisc", "add", "dev", dev, "root", "netem", "delay", delay],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                if result.returncode != 0:
                    for undo in done:
                        subprocess.run(undo, capture_output=True, timeout=30, check=False)
                    return result.stderr.strip() or f"tc exited with {result.returncode}"
                done.append([*where, "qdisc", "del", "dev", dev, "root"])
        return None

    def cut(self, host: Host) -> None:
        """Partitions ``host``: its link goes down on this side, so its packets are dropped
        silently (no reset, no error), as when a switch port or a cable fails."""
        ip("link", "set", host.veth, "down")
        host.up = False

    def heal(self, host: Host) -> None:
        ip("link", "set", host.veth, "up")
        host.up = True

    def close(self) -> None:
        """Deletes the namespaces (which takes their veth pairs along) and the bridge."""
        while self.hosts:
            host = self.hosts.pop()
            ip("link", "delete", host.veth, check=False)
            ip("netns", "delete", host.namespace, check=False)
        if self._made_bridge:
            ip("link", "delete", self.bridge, check=False)
            self._made_bridge = False
