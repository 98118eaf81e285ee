"""The floor: the simplest star all-reduce that moves the bytes of a dense SpINA call, in C.

Measured beside SpINA and gloo in the same worker processes (bench/paired.py, method
"floor"), so that every report says how close SpINA is to what the machine allows: SpINA/floor
next to SpINA/gloo. No protocol (bench/_floor.c has the datagram layout):

  1. scan:      the largest |x| of the worker's tensor (host_agent/blocks.block_scan, the
                same compiled pass SpINA's agent makes), its exponent (exponent_of_bits);
  2. agree:     one hello to the relay and back: the largest exponent of all workers, hence
                the shared scale 2**S of SpINA's rule (host_agent/blocks.quant_shift);
  3. transfer:  the whole tensor (dense, whatever its density) in chunks of SpINA's datagram
                size (block_size x nlanes int32), quantized, a window of nslots chunks in
                flight; the relay (one process, bench/_floor.c relay) adds the N contributions
                of a chunk and sends the sum to each worker, which dequantizes it in place.

No loss recovery, no duplicate or stale-datagram handling, no sparsity, no byte order: a lost
datagram stops the call with a TimeoutError. Its result is exactly what numpy computes from the
same quantization (tests/test_floor.py), so it passes the benchmark's SpINA check (the same
quantization bound, bit-identical on every rank).
"""
from __future__ import annotations

import select
import struct

import numpy as np

from host_agent.blocks import NONFINITE_BITS, block_scan, exponent_of_bits, quant_shift
from spina.net import bound_udp_socket

try:
    from bench import _floor
except ImportError as e:
    raise ImportError("bench._floor (bench/_floor.c) is not built: run `make setup` "
                      "(pip install -e .), or `make core` to rebuild it in place") from e

TAG_HELLO = 0xFFFFFFFF
HELLO = struct.Struct("=Iii")       # tag, rank, exponent
HELLO_REPLY = struct.Struct("=Ii")  # tag, the largest exponent
MAX_CHUNK = (65507 - 4) // 4        # int32 after the chunk index in one UDP datagram
SCAN_BLOCK = 1 << 16                # elements per block of the max-|x| scan (any size works)
TIMEOUT_S = 60.0                    # no datagram for this long: one was lost (as Agent's)


def chunk_for(block_size: int, nlanes: int) -> int:
    """int32 values per floor datagram: SpINA's nlanes blocks of block_size, within one UDP
    datagram."""
    return min(block_size * nlanes, MAX_CHUNK)


class FloorWorker:
    """One worker's side: a UDP socket connected to the relay, reused for every call."""

    def __init__(self, rank: int, nworkers: int, relay: tuple[str, int], window: int,
                 chunk: int, host: str = "127.0.0.1", timeout: float = TIMEOUT_S):
        if not 0 <= rank < nworkers:
            raise ValueError(f"rank: {rank} is not in 0..{nworkers - 1}")
        self.rank, self.nworkers, self.window, self.chunk = rank, nworkers, window, chunk
        self.timeout = timeout
        self.sock = bound_udp_socket(host, 0)
        self.sock.connect(relay)  # only the relay's datagrams reach this socket
        self.scratch = np.empty(2 * window * (chunk + 1), np.int32)  # send + receive buffers
        self.last_stats = (0, 0)  # datagrams and bytes the last call sent (hello not counted)

    def allreduce(self, buf: np.ndarray) -> np.ndarray:
        """Sum float32 `buf` over the workers, in place (every worker calls it); returns buf."""
        if not (isinstance(buf, np.ndarray) and buf.dtype == np.float32
                and buf.flags.c_contiguous and buf.flags.writeable):
            raise ValueError("buf: the floor sums a writable C-contiguous float32 numpy array")
        flat = buf.reshape(-1)
        bits = block_scan(flat, SCAN_BLOCK)[0]
        top = int(bits.max()) if len(bits) else 0
        if top >= NONFINITE_BITS:
            raise ValueError("buf: holds NaN or Inf (the floor sums finite values only)")
        exponent = self._agree(int(exponent_of_bits(np.array([top], np.int32))[0]))
        self.last_stats = _floor.allreduce(self.sock.fileno(), flat,
                                           quant_shift(exponent, self.nworkers), self.window,
                                           self.chunk, self.scratch, int(self.timeout * 1000))
        return buf

    def _agree(self, exponent: int) -> int:
        """The largest exponent of all workers: one hello to the relay and its answer."""
        self.sock.send(HELLO.pack(TAG_HELLO, self.rank, exponent))
        if not select.select([self.sock], [], [], self.timeout)[0]:
            raise TimeoutError(f"floor: no answer to rank {self.rank}'s hello within "
                               f"{self.timeout:g} s")
        tag, top = HELLO_REPLY.unpack(self.sock.recv(HELLO_REPLY.size))
        if tag != TAG_HELLO:
            raise RuntimeError(f"floor: expected the hello's answer, got tag {tag:#x}")
        return top

    def close(self) -> None:
        self.sock.close()


def relay_main(conn, netns: str | None, host: str, nworkers: int, window: int,
               chunk: int) -> None:
    """The relay in a process of its own (network namespace `netns` if given), bound to
    `host`, any free port. On `conn`: send our address; serve until the parent sends "stop",
    then answer with the relay's counters (bench/_floor.c relay)."""
    from spina.netns import enter
    try:
        enter(netns)
        sock = bound_udp_socket(host, 0)
        conn.send(sock.getsockname())
        stats = _floor.relay(sock.fileno(), conn.fileno(), nworkers, window, chunk)
        conn.recv()  # the "stop" that ended the loop
        conn.send(stats)
        sock.close()
    except BaseException as e:  # the parent reads it instead of waiting
        conn.send(dict(error=f"floor relay: {type(e).__name__}: {e}"))
        raise
