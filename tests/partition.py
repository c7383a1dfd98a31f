"""A network partition between this host and a TCP service, for tests: packets dropped
in the kernel, not a relay that stops reading (whose kernel still acknowledges every
byte and answers keepalives, so a client never learns the peer is gone).

:class:`Partition` makes a pair of virtual ethernet devices (veth) to a network
namespace of its own, and a relay in that namespace forwarding to the service through a
relay on this side: clients connect to :attr:`Partition.host`:`port`, across the veth.
:meth:`Partition.cut` takes the far end's device down: every packet to it vanishes, with
no reset and no error, as when a database host drops off the network. :meth:`heal` puts
it back. Needs root (``CAP_NET_ADMIN``), ``ip``, ``nsenter`` and ``unshare``; without them
:class:`Partition` raises :class:`PartitionUnavailable` naming what is missing.

``python -m tests.partition LISTEN_HOST LISTEN_PORT TO_HOST TO_PORT`` runs the relay.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Partition", "PartitionUnavailable", "relay"]


class PartitionUnavailable(RuntimeError):
    """This machine cannot make a partition (not root, or tools missing)."""


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
    src.close()  # each socket is the source of one of its connection's two pipes


def relay(listener: socket.socket, target: tuple[str, int]) -> None:
    """Forward every connection ``listener`` accepts to ``target`` until it is closed."""
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target, timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _listen(host: str, port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(128)
    return s


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode:
        raise PartitionUnavailable(f"{' '.join(cmd)} failed: {done.stderr.strip()}")


class Partition:
    """A path to ``target`` (host, port) that :meth:`cut` partitions; see the module."""

    def __init__(self, target: tuple[str, int]) -> None:
        missing = [t for t in ("ip", "nsenter", "unshare") if shutil.which(t) is None]
        if missing or os.geteuid() != 0:
            raise PartitionUnavailable(
                "a network partition needs root and the tools ip, nsenter and unshare "
                f"(missing: {', '.join(missing) or 'root'})"
            )
        tag = secrets.token_hex(3)
        self._near, self._far = f"bcp{tag}h", f"bcp{tag}n"
        net, sub = secrets.randbelow(250) + 1, secrets.randbelow(63) * 4  # a random /30
        self._near_ip, self.host = f"10.{net}.200.{sub + 1}", f"10.{net}.200.{sub + 2}"
        self.port = 5432
        self._ns: subprocess.Popen[bytes] | None = None
        self._relay: subprocess.Popen[bytes] | None = None
        self._near_listener: socket.socket | None = None
        try:
            self._setup(target)
        except BaseException:
            self.close()
            raise

    def _setup(self, target: tuple[str, int]) -> None:
        _run("ip", "link", "add", self._near, "type", "veth", "peer", "name", self._far)
        _run("ip", "addr", "add", f"{self._near_ip}/30", "dev", self._near)
        _run("ip", "link", "set", self._near, "up")
        self._ns = subprocess.Popen(["unshare", "-n", "sleep", "3600"])
        ns = str(self._ns.pid)
        deadline = time.monotonic() + 10
        while True:  # unshare has made the namespace once its child runs sleep
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{ns}/ns/net") != os.readlink("/proc/self/ns/net"):
                    break
            if time.monotonic() > deadline:
                raise PartitionUnavailable("unshare -n made no network namespace in 10 s")
            time.sleep(0.02)
        _run("ip", "link", "set", self._far, "netns", ns)
        self._in_ns("ip", "link", "set", "lo", "up")
        self._in_ns("ip", "addr", "add", f"{self.host}/30", "dev", self._far)
        self._in_ns("ip", "link", "set", self._far, "up")
        # this side: the veth's near address -> the service (which may listen on loopback)
        self._near_listener = _listen(self._near_ip, 0)
        near_port = self._near_listener.getsockname()[1]
        threading.Thread(target=relay, args=(self._near_listener, target), daemon=True).start()
        # the far side: host:port -> back across the veth
        self._relay = subprocess.Popen(
            ["nsenter", "-t", ns, "-n", sys.executable, "-m", "tests.partition",
             self.host, str(self.port), self._near_ip, str(near_port)],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self._relay.stdout is not None
        if self._relay.stdout.readline().strip() != b"ready":
            raise PartitionUnavailable("the relay in the namespace did not start")

    def _in_ns(self, *cmd: str) -> None:
        assert self._ns is not None
        _run("nsenter", "-t", str(self._ns.pid), "-n", *cmd)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this path's."""
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{self.host}:{self.port}" if userinfo else f"{self.host}:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def cut(self) -> None:
        """Every packet to the far side is dropped from now on; nothing is told."""
        self._in_ns("ip", "link", "set", self._far, "down")

    def heal(self) -> None:
        self._in_ns("ip", "link", "set", self._far, "up")

    def close(self) -> None:
        for proc in (self._relay, self._ns):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
        if self._relay is not None and self._relay.stdout is not None:
            self._relay.stdout.close()
        if self._near_listener is not None:
            self._near_listener.close()
        # deleting one end deletes the pair (the far end went with its namespace)
        subprocess.run(["ip", "link", "del", self._near], capture_output=True, check=False)

    def __enter__(self) -> Partition:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


if __name__ == "__main__":
    lh, lp, th, tp = sys.argv[1:5]
    server = _listen(lh, int(lp))
    print("ready", flush=True)
    relay(server, (th, int(tp)))
