"""Socket helpers shared by the host agent and the software switch."""
from __future__ import annotations

import errno
import ipaddress
import socket

from spina.config import ConfigError

_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux: root may exceed net.core.[rw]mem_max


def grow_buffers(sock: socket.socket, size: int = 32 << 20) -> None:
    """Large socket buffers: a window of 64 KB datagrams overflows the 208 KB default."""
    for opt, force in ((socket.SO_RCVBUF, _SO_RCVBUFFORCE), (socket.SO_SNDBUF, _SO_SNDBUFFORCE)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)


def bound_udp_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, port))
    grow_buffers(sock)
    return sock


def bind_own_address(host: str, port: int, field: str) -> socket.socket:
    """A UDP socket bound to (host, port), which must be one specific address of this host.

    A job file names each worker's address; binding a wildcard (0.0.0.0) instead would let a
    (root) daemon receive the job's traffic on every interface, and a foreign address cannot
    be bound at all. Both are ConfigErrors naming `field` (e.g. "job 1: field
    'workers[0].host'"); loopback addresses are local like any other.
    """
    addr = ipaddress.IPv4Address(host)
    if addr.is_unspecified or addr.is_multicast or addr == ipaddress.IPv4Address("255.255.255.255"):
        raise ConfigError(f"{field}: {host} is not one address of this host "
                          "(refusing to bind a wildcard, multicast or broadcast address)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"{field}: {host} is not an address of this host "
                              "(bind only the worker's own address)") from None
        raise OSError(e.errno, f"{field}: {host}:{port}: {e.strerror}") from None
    return sock
