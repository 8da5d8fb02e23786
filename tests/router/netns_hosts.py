"""Hosts made here: network namespaces joined by veth pairs, processes started in them, and
threads that live in one of them to make requests from there.

Used by the tests that run the router and its workers on separate "hosts", each reached over its
own address. Creating namespaces needs root and `ip` (iproute2); `NETNS_SKIPS` declares both.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request

import pytest
from router_helpers import wait_until

NETNS_SKIPS = [
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0, reason="network namespaces need root"
    ),
    pytest.mark.skipif(shutil.which("ip") is None, reason="the `ip` command (iproute2) is not installed"),
]

CLONE_NEWNET = 0x40000000


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """One namespace per role (named `tag`, this process's id and the role), the processes
    started in them, and a thread per namespace that requests are made from."""

    def __init__(self, roles: list[str], tag: str) -> None:
        prefix = f"{tag}{os.getpid()}"
        self.names = {role: f"{prefix}{role}" for role in roles}
        self.processes: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, str] = {}
        self._threads: dict[str, concurrent.futures.ThreadPoolExecutor] = {}

    def create(self, links: list[tuple[str, str, str, str]]) -> None:
        """The namespaces, and a veth pair for each (left role, its address, right role, its address)."""
        for name in self.names.values():
            ip("netns", "add", name)
            ip("-n", name, "link", "set", "lo", "up")
        for link in links:
            self._link(*link)

    def _link(self, left: str, left_address: str, right: str, right_address: str) -> None:
        """A veth pair from `left`'s namespace to `right`'s, with a /24 address at each end."""
        left_ns, right_ns = self.names[left], self.names[right]
        left_dev, right_dev = f"to-{right}", f"to-{left}"
        ip(
            "-n",
            left_ns,
            "link",
            "add",
            left_dev,
            "type",
            "veth",
            "peer",
            "name",
            right_dev,
            "netns",
            right_ns,
        )
        for ns, dev, address in ((left_ns, left_dev, left_address), (right_ns, right_dev, right_address)):
            ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")

    def route_via(self, role: str, gateway: str) -> None:
        """Send `role`'s traffic for other networks through `gateway` (a host that forwards)."""
        ip("-n", self.names[role], "route", "add", "default", "via", gateway)

    def forward(self, role: str) -> None:
        """Let `role`'s namespace forward packets between its links (a router host)."""
        subprocess.run(
            ["ip", "netns", "exec", self.names[role], "sysctl", "-qw", "net.ipv4.ip_forward=1"],
            check=True,
            capture_output=True,
        )

    def start(self, role: str, command: list[str]) -> None:
        """`ip netns exec <role's namespace> python COMMAND`, in its own process group."""
        log_fd, self.logs[role] = tempfile.mkstemp(prefix=f"fastdeploy-netns-{role}-", suffix=".log")
        self.processes[role] = subprocess.Popen(
            ["ip", "netns", "exec", self.names[role], sys.executable, *command],
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        os.close(log_fd)

    def output(self, role: str) -> str:
        with open(self.logs[role], encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def kill(self, role: str) -> None:
        process = self.processes[role]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def run_in(self, role: str, function, *args):
        """`function(*args)` run in `role`'s namespace."""
        if role not in self._threads:
            self._threads[role] = concurrent.futures.ThreadPoolExecutor(
                1, initializer=self._enter, initargs=(self.names[role],)
            )
        return self._threads[role].submit(function, *args).result()

    def from_client(self, function, *args):
        """`function(*args)` run in the client's namespace."""
        return self.run_in("client", function, *args)

    def wait_healthy(self, role: str, url: str, via: str = "client") -> None:
        def healthy() -> bool:
            if self.processes[role].poll() is not None:
                raise AssertionError(f"{role} exited:\n{self.output(role)}")
            return self.run_in(via, status_of, url + "/health") == 200

        wait_until(healthy, 300, f"{role} at {url} to become healthy", interval=0.2)

    @staticmethod
    def _enter(namespace: str) -> None:
        with open(f"/var/run/netns/{namespace}") as handle:
            if ctypes.CDLL(None, use_errno=True).setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {namespace} failed")

    def remove(self) -> None:
        for role in list(self.processes):
            self.kill(role)
        for thread in self._threads.values():
            thread.shutdown()
        for name in self.names.values():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except OSError:
        return 0


def text_of(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()
