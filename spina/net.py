"""Socket helpers shared by the host agent and the software switch."""
from __future__ import annotations

import datetime
import errno
import ipaddress
import os
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


def init_loopback_gloo(rank: int, world_size: int, port: int, timeout: float = 300.0) -> None:
    """`torch.distributed.init_process_group("gloo")` with every socket on 127.0.0.1.

    With init_method "tcp://127.0.0.1:PORT" rank 0's TCPStore listens on every interface
    (torch binds the wildcard whatever host the URL names), and gloo's transport binds the
    address the host name resolves to. Here rank 0 binds the store's socket itself (handed over
    as master_listen_fd) and GLOO_SOCKET_IFNAME=lo keeps the transport on loopback: the demo's
    and the benchmark's processes never listen beyond this host.
    """
    import torch.distributed as dist
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    wait = datetime.timedelta(seconds=timeout)
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        store = dist.TCPStore("127.0.0.1", port, world_size, True, timeout=wait,
                              master_listen_fd=listener.detach())  # the store owns it now
    else:
        store = dist.TCPStore("127.0.0.1", port, world_size, False, timeout=wait)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
