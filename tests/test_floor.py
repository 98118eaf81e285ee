"""The benchmarks' floor (bench/floor.py, bench/_floor.c): exact sums, exact datagram counts.

Run just this file: python -m pytest tests/test_floor.py

The relay and the workers run as threads of this process (the C loops release the GIL), on
127.0.0.1. A fair floor must be correct: its result is compared bit for bit with numpy's sum
of the same quantization (SpINA's shared-exponent rule, host_agent/blocks.quant_shift).
"""
from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from bench import _floor
from bench.floor import FloorWorker, chunk_for, relay_main
from host_agent.blocks import quant_shift
from spina.net import bound_udp_socket


class Relay:
    """The relay loop in a thread, stopped through a pipe; `stats` once stopped."""

    def __init__(self, nworkers: int, window: int, chunk: int):
        self.sock = bound_udp_socket()
        self.stop_r, self.stop_w = os.pipe()
        self.stats = self.error = None
        self.thread = threading.Thread(target=self._run, args=(nworkers, window, chunk))
        self.thread.start()

    def _run(self, nworkers, window, chunk):
        try:
            self.stats = _floor.relay(self.sock.fileno(), self.stop_r, nworkers, window, chunk)
        except Exception as e:  # the test asserts on it
            self.error = e

    def stop(self) -> None:
        os.write(self.stop_w, b"x")
        self.thread.join()
        for fd in (self.stop_r, self.stop_w):
            os.close(fd)
        self.sock.close()


def run_call(workers, tensors):
    """Every worker's allreduce of its tensor (a copy), in threads: the results."""
    bufs = [t.copy() for t in tensors]
    errors = []

    def call(w, b):
        try:
            w.allreduce(b)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=call, args=(w, b)) for w, b in zip(workers, bufs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return bufs


def numpy_floor(tensors) -> np.ndarray:
    """The floor's sum by numpy: one exponent for all, round(x * 2**S), int32 sum, float32."""
    top = max(float(np.abs(t).max()) for t in tensors)
    shift = quant_shift(int(np.frexp(np.float32(top))[1]), len(tensors))
    total = sum(np.rint(t * np.float32(2.0 ** shift)).astype(np.int32) for t in tensors)
    return total.astype(np.float32) * np.float32(2.0 ** -shift)


def test_floor_sums_exactly_and_counts_every_datagram():
    """2 workers, 3 calls of 100,003 float32 of unequal scales through chunks of 1,000 and a
    window of 4 (the partial last chunk, slot reuse): every result is numpy's sum of the same
    quantization, bit for bit, on both ranks; datagrams and bytes are exactly one per chunk."""
    n, chunk, window, calls = 100_003, 1000, 4, 3
    nchunks = -(-n // chunk)
    relay = Relay(2, window, chunk)
    workers = [FloorWorker(r, 2, relay.sock.getsockname(), window, chunk) for r in range(2)]
    try:
        rng = np.random.default_rng(27)
        for c in range(calls):
            tensors = [rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** (c - r))
                       for r in range(2)]
            tensors[1][:5000] = 0  # a zero stretch at one worker
            want = numpy_floor(tensors)
            got = run_call(workers, tensors)
            for b in got:
                assert b.tobytes() == want.tobytes()
            exact = tensors[0].astype(np.float64) + tensors[1]
            assert np.abs(got[0] - exact).max() < 1e-6 * np.abs(exact).max()
            for w in workers:
                assert w.last_stats == (nchunks, 4 * nchunks + 4 * n)
    finally:
        for w in workers:
            w.close()
        relay.stop()
    assert relay.error is None, relay.error
    per_call = 2 * (nchunks + 1)  # every worker: a hello and its chunks; results likewise
    assert relay.stats == dict(datagrams_in=calls * per_call, datagrams_out=calls * per_call,
                               bytes_in=calls * 2 * (12 + 4 * nchunks + 4 * n),
                               bytes_out=calls * 2 * (8 + 4 * nchunks + 4 * n),
                               results=calls * nchunks, calls=calls)


def test_floor_all_zero_and_empty_tensors():
    """A tensor of zeros sums to zeros (no exponent: shift 0); an empty one sends no chunk."""
    relay = Relay(2, 2, 64)
    workers = [FloorWorker(r, 2, relay.sock.getsockname(), 2, 64) for r in range(2)]
    try:
        got = run_call(workers, [np.zeros(300, np.float32)] * 2)
        assert all(not b.any() for b in got)
        got = run_call(workers, [np.zeros(0, np.float32)] * 2)
        assert all(len(b) == 0 for b in got) and workers[0].last_stats == (0, 0)
    finally:
        for w in workers:
            w.close()
        relay.stop()
    assert relay.error is None and relay.stats["results"] == 5


def test_floor_bad_input_and_lost_datagram():
    """Bad buffers and parameters: one-line errors naming the field; a relay that never
    answers: a TimeoutError that says the floor has no recovery."""
    quiet = bound_udp_socket()  # a "relay" that never answers
    w = FloorWorker(0, 1, quiet.getsockname(), 2, 64, timeout=0.2)
    try:
        for bad in (np.zeros(4, np.float64), np.zeros((4, 4), np.float32)[:, 0],
                    np.array([1.0, np.nan], np.float32)):
            with pytest.raises(ValueError, match="^buf: "):
                w.allreduce(bad)
        with pytest.raises(TimeoutError, match="no answer to rank 0's hello"):
            w.allreduce(np.ones(8, np.float32))
        with pytest.raises(TimeoutError, match="lost .the floor has no recovery"):
            _floor.allreduce(w.sock.fileno(), np.ones(8, np.float32), 0, 2, 64, w.scratch, 200)
        with pytest.raises(ValueError, match="^chunk: 20000 is not in 1..16375"):
            _floor.allreduce(w.sock.fileno(), np.ones(8, np.float32), 0, 2, 20000,
                             w.scratch, 200)
        with pytest.raises(ValueError, match="^scratch: "):
            _floor.allreduce(w.sock.fileno(), np.ones(8, np.float32), 0, 4, 64, w.scratch, 200)
        with pytest.raises(ValueError, match="^nworkers: 0 is not in"):
            _floor.relay(quiet.fileno(), quiet.fileno(), 0, 2, 64)
    finally:
        w.close()
        quiet.close()
    with pytest.raises(ValueError, match="^rank: 2 is not in 0..1"):
        FloorWorker(2, 2, ("127.0.0.1", 9), 2, 64)
    assert chunk_for(256, 56) == 14336 and chunk_for(256, 64) == 16375  # one datagram at most


def test_relay_rejects_a_datagram_it_cannot_place():
    """Two chunks in one slot (more in flight than the relay's window): the relay stops with
    an error naming the chunk instead of adding them together."""
    relay = Relay(2, 2, 16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for k in (0, 2):  # 2 mod 2 == 0: the slot of chunk 0, still waiting for rank 1
            s.sendto(np.array([k] + [1] * 16, np.int32).tobytes(), relay.sock.getsockname())
        relay.thread.join(timeout=30)
    relay.stop()
    assert isinstance(relay.error, RuntimeError)
    assert "chunk 2 while its slot holds another" in str(relay.error)


def test_relay_process_reports_its_counters():
    """relay_main, as bench/paired.py runs it: address, serve, counters after "stop"."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=relay_main, args=(child, None, "127.0.0.1", 1, 2, 64))
    proc.start()
    try:
        assert parent.poll(60), "the relay process did not start"
        addr = parent.recv()
        w = FloorWorker(0, 1, tuple(addr), 2, 64)
        x = np.arange(200, dtype=np.float32)
        want = numpy_floor([x.copy()])
        assert w.allreduce(x) is x and x.tobytes() == want.tobytes()
        w.close()
        parent.send("stop")
        assert parent.poll(60)
        stats = parent.recv()
    finally:
        proc.join(timeout=30)
    assert stats["results"] == 4 and stats["calls"] == 1 and proc.exitcode == 0
