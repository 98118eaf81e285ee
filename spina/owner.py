"""Who holds an address: the process behind a port another program took, named by the tool
that found it in use (issue 44, Build 3).

A second deployment on one machine (another user's `serve`, switch or daemon) takes the
default ports; "Address already in use" alone leaves the user guessing. Linux says which
socket holds a TCP or UDP port (/proc/net/{tcp,udp}: its inode) and which process has that
socket open (/proc/PID/fd); the process's command line says whether it is SpINA's and which
part. Reading another user's /proc/PID/fd needs root or the same user: without it the message
says only that the address is in use. Stdlib only: every layer may import it.

    >>> in_use("udp", "127.0.0.1", 47000, "UDP port")     # doctest: +SKIP
    '127.0.0.1:47000 (UDP port) is held by another SpINA process: the software switch (pid
    4242: python -m softswitch udp --port 47000)'
"""
from __future__ import annotations

import errno
import os
import socket
import struct

# A SpINA program by how it was started: (python -m MODULE, or the `spina` command's
# subcommand) -> what it is. The first match in argv wins.
_MODULES = {"softswitch": "software switch", "controller": "controller",
            "host_agent.launch": "launcher", "spina_cli": "spina command"}
_SPINA_COMMANDS = {"serve": "controller", "deploy": "controller", "switch": "software switch",
                   "demo": "demo", "agent": "host agent", "status": "controller status"}
_TCP_LISTEN, _UDP_UNCONNECTED = "0A", "07"


def _inodes(proto: str, host: str, port: int) -> set[str]:
    """Inodes of the sockets bound to (host, port) (or to the wildcard on `port`): listening
    TCP sockets, unconnected UDP ones."""
    try:
        want = socket.inet_aton(host)
    except OSError:
        want = b"\0\0\0\0"
    state = _TCP_LISTEN if proto == "tcp" else _UDP_UNCONNECTED
    out = set()
    for table in (proto, proto + "6"):  # gRPC listens on IPv6 sockets (v4-mapped addresses)
        try:
            with open(f"/proc/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    ip_hex, port_hex = cols[1].split(":")
                    if len(ip_hex) == 32:  # IPv6: the wildcard, or a v4-mapped address
                        if ip_hex.strip("0") == "":
                            ip_hex = "0" * 8
                        elif ip_hex[:24] == "0000000000000000FFFF0000":
                            ip_hex = ip_hex[24:]
                        else:
                            continue
                    ip = struct.pack("<I", int(ip_hex, 16))  # the kernel prints host order
                    if int(port_hex, 16) == port and cols[3] == state \
                            and (ip == want or ip == b"\0\0\0\0" or want == b"\0\0\0\0"):
                        out.add(cols[9])
        except (OSError, StopIteration, ValueError, IndexError):
            pass
    return out


def holder(proto: str, host: str, port: int) -> tuple[int, list[str]] | None:
    """(pid, argv) of a process holding `proto` ("tcp" or "udp") `host`:`port`, or None when
    no process this one may look into holds it."""
    links = {f"socket:[{i}]" for i in _inodes(proto, host, port)}
    if not links:
        return None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in links:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
                    return int(pid), argv
            except OSError:
                continue
    return None


def spina_part(argv: list[str]) -> str | None:
    """Which SpINA program a command line runs ("software switch", "controller", ...), or
    None for another program."""
    for i, a in enumerate(argv):
        if a == "-m" and i + 1 < len(argv):
            mod = argv[i + 1]
            if mod == "host_agent":
                return "agent daemon" if "daemon" in argv[i + 2:] else "host agent"
            for name, what in _MODULES.items():
                if mod == name or mod.startswith(name + "."):
                    return what
            return None
        if os.path.basename(a) == "spina" and i + 1 < len(argv):
            sub = argv[i + 1]
            if sub == "agent" and "daemon" in argv[i + 2:]:
                return "agent daemon"
            return _SPINA_COMMANDS.get(sub, "spina command")
    return None


def describe(proto: str, host: str, port: int) -> str | None:
    """Who holds the address, as a phrase ("another SpINA process: the controller (pid N:
    COMMAND)" or "pid N: COMMAND"), or None when unknown."""
    got = holder(proto, host, port)
    if got is None:
        return None
    pid, argv = got
    cmd = " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(argv))
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    if pid == os.getpid():
        return f"this process (pid {pid})"
    part = spina_part(argv)
    if part is None:
        return f"pid {pid}: {cmd}"
    return f"another SpINA process: the {part} (pid {pid}: {cmd})"


class AddressInUse(OSError):
    """EADDRINUSE with the message naming who holds the address (str: the message alone)."""

    def __init__(self, message: str):
        super().__init__(errno.EADDRINUSE, message)

    def __str__(self) -> str:
        return self.strerror


def in_use(proto: str, host: str, port: int, what: str) -> str:
    """The message for an address in use: `what` ("UDP port", "P4Runtime port", ...) and who
    holds it, when this process may know."""
    who = describe(proto, host, port)
    where = f"{host}:{port} ({what})"
    return f"{where} is held by {who}" if who else f"{where}: address already in use"


__all__ = ["AddressInUse", "holder", "spina_part", "describe", "in_use"]
