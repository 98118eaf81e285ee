"""Free loopback ports for tests that start servers of their own (imported by tests)."""
from __future__ import annotations

import socket


def free_ports(n: int, kind=socket.SOCK_DGRAM, host: str = "127.0.0.1") -> list[int]:
    """n ports free at this moment (UDP by default; kind=socket.SOCK_STREAM for TCP), to be
    bound right after by whoever needs them."""
    socks = [socket.socket(socket.AF_INET, kind) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_tcp_port() -> int:
    return free_ports(1, socket.SOCK_STREAM)[0]
