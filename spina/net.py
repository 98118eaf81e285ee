"""Socket helpers shared by the host agent and the software switch."""
from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import socket
import tempfile
import threading
import time

from spina import owner
from spina.config import ConfigError

_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33  # Linux: root may exceed net.core.[rw]mem_max


def grow_buffers(sock: socket.socket, size: int = 32 << 20) -> None:
    """Large socket buffers: a window of 64 KB datagrams overflows the 208 KB default."""
    for opt, force in ((socket.SO_RCVBUF, _SO_RCVBUFFORCE), (socket.SO_SNDBUF, _SO_SNDBUFFORCE)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
        except OSError:
            sock.setsockopt(socket.SOL_SOCKET, opt, size)


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# Ports handed out on this machine in the last RESERVE_SECONDS, one empty file each: a port
# chosen for a job file is bound later, by another process (a worker), and is free meanwhile.
RESERVE_DIR = os.path.join(tempfile.gettempdir(), "spina-ports")
RESERVE_SECONDS = 1800


def _reserve(port: int) -> bool:
    """True if `port` was not handed out on this machine in the last RESERVE_SECONDS (it is
    now, by this process); True as well where the reservations cannot be written."""
    path = os.path.join(RESERVE_DIR, str(port))
    for _ in range(2):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return True
        except FileExistsError:
            try:
                if time.time() - os.stat(path).st_mtime < RESERVE_SECONDS:
                    return False
                os.unlink(path)  # an old reservation: take it over
            except FileNotFoundError:
                pass  # another process took it over just now: try once more
        except OSError:
            try:
                os.makedirs(RESERVE_DIR, mode=0o1777, exist_ok=True)
                os.chmod(RESERVE_DIR, 0o1777)  # every user's choosers share it
            except OSError:
                return True  # no shared record here: the free check alone decides
    return False


class _PortChooser:
    """Hands out ports outside the kernel's ephemeral range, each at most once per machine in
    RESERVE_SECONDS.

    A port found by binding port 0 and closing is an ephemeral port: any socket bound to port 0
    afterwards (an agent's, a gRPC client's) may be given the same one before its chooser binds
    it, and then a server fails with "Address already in use". Ports below the ephemeral range
    are never handed to port-0 binds, so only another chooser can take them, and every chooser
    on the machine records what it hands out (RESERVE_DIR): a port one process wrote into a job
    file, free until the job's worker binds it, is not handed to another process meanwhile.
    """

    def __init__(self):
        self.lock = threading.Lock()
        lo, hi = _ephemeral_range()
        self.first, self.last = (20000, lo - 1) if lo - 20000 >= 2000 else (hi + 1, 65535)
        span = self.last - self.first + 1
        self.next = self.first + (os.getpid() * 7919) % span if span >= 2000 else None

    def choose(self, n: int, host: str) -> list[int]:
        with self.lock:
            if self.next is None:  # no room outside the ephemeral range: the kernel chooses
                return self._from_kernel(n, host)
            held, ports = [], []
            try:
                # Reserved ports are passed over; should every one be (a machine that chose
                # this many lately), a second pass takes free ones whatever their record.
                for reserved in (_reserve, lambda port: True):
                    for _ in range(self.last - self.first + 1):
                        if len(ports) == n:
                            return ports
                        port = self.next
                        self.next = self.first if port == self.last else port + 1
                        if port in ports:
                            continue
                        socks = self._hold(host, port) if reserved(port) else []
                        if socks:
                            held += socks
                            ports.append(port)
                    if len(ports) == n:
                        return ports
                raise OSError(errno.EADDRINUSE, f"no {n} free ports in {self.first}..{self.last}")
            finally:
                for s in held:
                    s.close()

    @staticmethod
    def _hold(host: str, port: int) -> list[socket.socket]:
        """Sockets holding `port` for both UDP and TCP, or [] when either is taken."""
        socks = []
        try:
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                s = socket.socket(socket.AF_INET, kind)
                socks.append(s)
                s.bind((host, port))
            return socks
        except OSError:
            for s in socks:
                s.close()
            return []

    @staticmethod
    def _from_kernel(n: int, host: str) -> list[int]:
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
        try:
            for s in socks:
                s.bind((host, 0))
            return [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()


_chooser = _PortChooser()


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free for both UDP and TCP on `host` a moment ago, never handed out
    before by this process, and never ones the kernel gives to a socket bound to port 0."""
    return _chooser.choose(n, host)


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


BIND_RETRY_SECONDS = 2.0


def bind_retrying(sock: socket.socket, addr: tuple[str, int],
                  seconds: float = BIND_RETRY_SECONDS, what: str = "port") -> None:
    """sock.bind(addr), tried again for up to `seconds` while the port is in use: a port a
    chooser handed out can be held for a moment by another process's probe (seen in the test
    suite: free a moment before, free again after). A port another process keeps still fails
    after `seconds`, with owner.AddressInUse naming `what` the port is and who holds it."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            sock.bind(addr)
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE or addr[1] == 0:
                raise
            if time.monotonic() >= deadline:
                proto = "udp" if sock.type == socket.SOCK_DGRAM else "tcp"
                raise owner.AddressInUse(owner.in_use(proto, *addr[:2], what)) from None
            time.sleep(0.05)


def bound_udp_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, port))
    grow_buffers(sock)
    return sock


def check_tcp_free(host: str, port: int, what: str) -> None:
    """OSError "cannot serve WHAT on HOST:PORT: ..." if a TCP listener holds the address (a
    gRPC server would print its own multi-line complaint first; a second server on one port
    must not start). Port 0 is always free."""
    if port == 0:
        return
    fam = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no listener
        try:
            s.bind((host.strip("[]"), port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:  # and who holds it: another SpINA process?
                raise owner.AddressInUse(f"cannot serve {what}: " + owner.in_use(
                    "tcp", host.strip("[]"), port, f"{what} port")) from None
            raise OSError(e.errno, f"cannot serve {what} on {host}:{port}: {e.strerror}") \
                from None


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
        bind_retrying(sock, (host, port), what="the worker's port")
    except owner.AddressInUse as e:  # who holds it: another agent or daemon, perhaps
        sock.close()
        raise owner.AddressInUse(f"{field}: {e}") from None
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
