"""Socket helpers shared by the host agent and the software switch."""
from __future__ import annotations

import socket

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
