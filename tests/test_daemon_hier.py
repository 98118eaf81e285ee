"""Hierarchical reduction through the daemon (host_agent/daemon/hier.py): the local processes
of a host are local ranks of one rank of the job, summed on the host, one contribution each.

Run just these tests:  .venv/bin/python -m pytest tests/test_daemon_hier.py

Each test runs a software switch and one Daemon per "host" on threads of the test process
(each daemon on its own Unix socket, all on the one switch), the local processes as
DaemonClients on threads (a subprocess where one has to die).
"""
import concurrent.futures
import contextlib
import subprocess
import sys
import threading

import numpy as np
import pytest

from host_agent.agent import SpinaError
from host_agent.blocks import exponent_of_bits, quant_shift
from host_agent.daemon import Daemon, DaemonClient, DaemonConfig, server, status
from host_agent.launch import local_job
from softswitch.udp import UdpSwitch
from spina.config import JobFile
from tests.test_daemon import ROOT, _env
from tests.waits import until

# rto 1 s: no timer resend within a call on a slow shared machine, so packet counts are exact
_CFG = {"timeout": 20.0, "rto": 1.0}


@pytest.fixture(autouse=True)
def _one_tracker_registration(monkeypatch):
    """Daemon and clients share this process, so a segment's one resource-tracker registration
    is the client's: the daemon's unregister (server._open_shm, meant for a daemon process of
    its own) would take it, and the client's unlink would then make the tracker complain."""
    monkeypatch.setattr(server.resource_tracker, "unregister", lambda *a: None)


@contextlib.contextmanager
def _hosts(tmp_path, sw, hosts, job=1, **cfg):
    """(job file, [socket of host h]): a job of `hosts` ranks on `sw`, a Daemon per host."""
    jobcfg = local_job(hosts, job=job, slot_base=16 * (job - 1))  # jobs side by side
    sw.add_job(jobcfg)
    job_file = tmp_path / f"job{job}.json"
    JobFile(jobcfg, sw.address).write(job_file)
    daemons, threads = [], []
    try:
        for h in range(hosts):
            d = Daemon(DaemonConfig(socket=str(tmp_path / f"j{job}h{h}.sock"),
                                    **{**_CFG, **cfg}).validate())
            daemons.append(d)
            threads.append(threading.Thread(target=d.serve_forever, daemon=True))
            threads[-1].start()
        yield str(job_file), [d.cfg.socket for d in daemons]
    finally:
        for d in daemons:
            d.stop()
        for t in threads:
            t.join(timeout=10)


def _clients(job_file, socks, L):
    """client[h][l]: local rank l of the L on host h (socket socks[h])."""
    return [[DaemonClient(job_file, h, s, local_rank=lr, local_size=L) for lr in range(L)]
            for h, s in enumerate(socks)]


def _allreduce_all(clients, xs, op="allreduce"):
    """Every client's allreduce (or `op`) of its tensor, at once: their results in the same
    layout."""
    flat = [c for row in clients for c in row]
    with concurrent.futures.ThreadPoolExecutor(len(flat)) as pool:
        futs = [pool.submit(getattr(c, op), x) for c, x in zip(flat, xs)]
        outs = [f.result(timeout=60) for f in futs]
    return outs


def _bound(xs, H, L):
    """hier.py's documented bound per element for float32 `xs` (host h's local ranks at
    h*L..h*L+L-1): H * 2**(-S-1) + half an ulp of each host sum + half an ulp of the sum, with S
    for the largest host sum (each slot's own shift is at least that)."""
    hs = [np.sum(np.stack(xs[h * L:(h + 1) * L]).astype(np.float64), axis=0).astype(np.float32)
          for h in range(H)]
    absmax = np.array([max(np.abs(h).max() for h in hs)], np.float32)
    S = quant_shift(int(exponent_of_bits(absmax.view(np.uint32))[0]), H)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    return exact, (H * 2.0 ** (-S - 1) + sum(np.spacing(np.abs(h)) for h in hs) / 2
                   + np.spacing(np.abs(exact.astype(np.float32))) / 2)


@pytest.mark.parametrize("L", [2, 3, 4])
def test_hosts_of_local_processes_sum_exactly_and_identically(tmp_path, L):
    """2 hosts x L local processes: float sums within the documented bound of numpy's,
    bit-identical on every process; int32 sums exact."""
    H, n = 2, 3001
    rng = np.random.default_rng(L)
    xs = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)
          for _ in range(H * L)]
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, H) as (job_file, socks):
        clients = _clients(job_file, socks, L)
        try:
            for _ in range(2):  # the second call reuses every segment and the host rounds
                outs = _allreduce_all(clients, xs)
                exact, bound = _bound(xs, H, L)
                err = np.abs(outs[0].astype(np.float64) - exact)
                assert (err <= bound).all(), float((err - bound).max())
                assert err.max() > 0  # float data: the check above is not trivially exact
                for o in outs[1:]:
                    assert o.tobytes() == outs[0].tobytes()
            ints = [rng.integers(-2**31, 2**31, 700, dtype=np.int64).astype(np.int32)
                    for _ in range(H * L)]
            outs = _allreduce_all(clients, ints)
            want = np.sum(np.stack(ints), axis=0, dtype=np.int32)  # wraps as the switch does
            for o in outs:
                np.testing.assert_array_equal(o, want)
            assert [status(s)["calls_done"] for s in socks] == [3, 3]  # one agent call per host
            assert clients[1][0].world_size == H * L  # what a DDP hook must average by
            from host_agent.hooks import SpinaHookState  # torch: only this check needs it
            assert SpinaHookState(clients[1][0]).world_size == H * L  # the hooks' default
        finally:
            for row in clients:
                for c in row:
                    c.close()


def test_switch_sees_hosts_one_Lth_of_the_packets_and_bytes(tmp_path):
    """4 local processes on each of 2 hosts put exactly 1/4 of the packets and bytes through
    the switch that 8 processes as 8 ranks do, for the same dense tensors."""
    H, L, n = 2, 4, 20000
    rng = np.random.default_rng(7)
    xs = [(rng.random(n) + 0.5).astype(np.float32) for _ in range(H * L)]  # no zero block
    counts = {}
    with UdpSwitch(port=0) as sw:
        for mode, (hosts, local) in (("hier", (H, L)), ("flat", (H * L, 0))):
            with _hosts(tmp_path, sw, hosts, job=len(counts) + 1) as (job_file, socks):
                clients = (_clients(job_file, socks, L) if local else
                           [[DaemonClient(job_file, r, socks[r])] for r in range(hosts)])
                try:
                    before = (sw.packets_in, sw.bytes_in, sw.packets_out, sw.bytes_out)
                    outs = _allreduce_all(clients, xs)
                    after = (sw.packets_in, sw.bytes_in, sw.packets_out, sw.bytes_out)
                    stats = [c.last_stats for row in clients for c in row]
                finally:
                    for row in clients:
                        for c in row:
                            c.close()
            assert sum(s.resends for s in stats) == 0  # else the counts below include resends
            counts[mode] = [a - b for a, b in zip(after, before)]
            np.testing.assert_allclose(outs[0], np.sum(np.stack(xs), axis=0), rtol=1e-6)
            for o in outs[1:]:
                assert o.tobytes() == outs[0].tobytes()
    assert counts["hier"][0] > 0
    assert [c * L for c in counts["hier"]] == counts["flat"], counts


@pytest.mark.parametrize("L", [1, 3])
def test_local_processes_all_gather_every_shard_bit_for_bit(tmp_path, L):
    """2 hosts x L local processes all-gather through their daemons: every process gets all
    2L shards in process order (host x L + local rank) bit for bit, float32 of every bit
    pattern (NaNs too) and an odd number of int16 bytes; the switch sees one shard per host
    (its chunks, plus exactly the requests and resends the hosts' stats count)."""
    H = 2
    rng = np.random.default_rng(L)
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, H) as (job_file, socks):
        clients = _clients(job_file, socks, L)
        job = JobFile.load(job_file).job
        try:
            for dtype, n in ((np.float32, 1001), (np.int16, 7)):
                bits = np.uint32 if dtype == np.float32 else np.uint16  # every bit pattern
                xs = [rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True)
                      .view(dtype) for _ in range(H * L)]
                before = sw.packets_in
                outs = _allreduce_all(clients, xs, "allgather")
                want = np.stack(xs)
                for o in outs:
                    assert o.dtype == dtype and o.shape == (H * L, n)
                    assert o.tobytes() == want.tobytes()
                blocks = -(-L * want[0].nbytes // (4 * job.block_size))
                chunks = -(-blocks // job.nlanes)
                extra = sum(c[0].last_gather_stats.requests + c[0].last_gather_stats.resends
                            for c in clients)
                assert sw.packets_in - before == H * chunks + extra
                assert clients[0][0].last_gather_stats.shard_bytes == L * want[0].nbytes
            assert [status(s)["calls_done"] for s in socks] == [2, 2]  # one agent call per host
        finally:
            for row in clients:
                for c in row:
                    c.close()


@pytest.mark.parametrize("L", [1, 3])
def test_local_processes_reduce_scatter_their_shards(tmp_path, L):
    """2 hosts x L local processes reduce-scatter through their daemons: every process gets
    its torch.chunk shard over the 2L processes (process host x L + local rank) of the sum,
    int32 exact for an odd length (1001: the host sums padded to whole process shards) and
    float32 bit for bit that part of the daemons' all-reduce of the same tensors; the stats
    are the host's one call (one contribution per host)."""
    from host_agent.scatter import shard_bounds
    H, P = 2, 2 * L
    rng = np.random.default_rng(10 + L)
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, H) as (job_file, socks):
        clients = _clients(job_file, socks, L)
        try:
            for n in (1001, 24 * P):
                xs = [rng.integers(-1000, 1000, n).astype(np.int32) for _ in range(P)]
                want = np.sum(xs, axis=0, dtype=np.int32)
                outs = _allreduce_all(clients, xs, "reduce_scatter")
                for p, o in enumerate(outs):
                    lo, hi = shard_bounds(n, P, p)
                    assert o.dtype == np.int32 and o.tobytes() == want[lo:hi].tobytes(), (n, p)
            n = 4099
            xs = [rng.standard_normal(n).astype(np.float32) for _ in range(P)]
            full = _allreduce_all(clients, xs)
            outs = _allreduce_all(clients, xs, "reduce_scatter")
            for p, o in enumerate(outs):
                lo, hi = shard_bounds(n, P, p)
                assert o.dtype == np.float32 and o.tobytes() == full[p][lo:hi].tobytes(), p
            st = clients[0][0].last_stats
            assert st.length == -(-n // P) * P and st.packets_sent > 0
            assert [status(s)["calls_done"] for s in socks] == [4, 4]  # one call per host
        finally:
            for row in clients:
                for c in row:
                    c.close()


def test_local_ranks_calling_different_collectives_all_fail(tmp_path):
    """One local rank's allreduce against another's allgather: both fail naming 'op'."""
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, 1) as (job_file, socks):
        clients = _clients(job_file, socks, 2)
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(getattr(c, op), np.ones(10, np.float32))
                        for c, op in zip(clients[0], ("allreduce", "allgather"))]
                for f in futs:
                    with pytest.raises(SpinaError, match=r"field 'op': the local ranks disagree "
                                                         r"on the collective \(local rank 0: "
                                                         r"allreduce, local rank 1: allgather\)"):
                        f.result(timeout=30)
            assert sw.packets_in == 0
        finally:
            for c in clients[0]:
                c.close()


def test_bad_local_fields_are_refused_by_name(tmp_path):
    """A local_size that differs from the attached processes', a local rank attached twice, out
    of range or half given: refused naming the field; the attached processes go on."""
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, 1) as (job_file, socks):
        sock = socks[0]
        c0 = DaemonClient(job_file, 0, sock, local_rank=0, local_size=2)
        try:
            for kw, msg in (
                    (dict(local_rank=1, local_size=3),
                     "attach: field 'local_size': 3 differs from the 2 the attached local ranks "
                     "(local rank 0 pid "),
                    (dict(local_rank=None, local_size=None),  # one process as the rank: size 1
                     "attach: field 'local_size': 1 differs from the 2"),
                    (dict(local_rank=0, local_size=2),
                     "attach: field 'local_rank': local rank 0 is attached already (pid "),
                    (dict(local_rank=2, local_size=2),
                     "attach: field 'local_rank': must be in 0..1, got 2"),
                    (dict(local_rank=0, local_size=0),
                     "attach: field 'local_size': must be at least 1, got 0"),
                    (dict(local_rank=1),
                     "attach: field 'local_size': is missing (local_rank is given)"),
                    (dict(local_size=2),
                     "attach: field 'local_rank': is missing (local_size is given)")):
                with pytest.raises(SpinaError) as e:
                    DaemonClient(job_file, 0, sock, **kw)
                assert str(e.value).startswith(msg), (kw, str(e.value))
            with DaemonClient(job_file, 0, sock, local_rank=1, local_size=2) as c1:
                outs = _allreduce_all([[c0, c1]], [np.full(300, 1.5, np.float32),
                                                   np.full(300, 2.25, np.float32)])
            for o in outs:
                np.testing.assert_array_equal(o, np.full(300, 3.75, np.float32))
            assert status(sock)["ok"]
        finally:
            c0.close()


def test_local_lengths_that_disagree_fail_every_local_rank(tmp_path):
    """Local ranks calling with different lengths: each gets the error naming 'n' and both
    lengths; the host sends nothing."""
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, 1) as (job_file, socks):
        clients = _clients(job_file, socks, 2)
        try:
            flat = [c for row in clients for c in row]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                futs = [pool.submit(c.allreduce, np.ones(k, np.float32))
                        for c, k in zip(flat, (10, 12))]
                for f in futs:
                    with pytest.raises(SpinaError, match=r"field 'n': the local ranks disagree "
                                                         r"on the tensor length \(local rank 0: "
                                                         r"10, local rank 1: 12\)"):
                        f.result(timeout=30)
            assert sw.packets_in == 0
        finally:
            for c in flat:
                c.close()


LOCAL = """
import sys, time, numpy as np
from host_agent.daemon import DaemonClient
c = DaemonClient(sys.argv[1], 0, sys.argv[2], local_rank=1, local_size=2)
if sys.argv[3] == "call":
    c.allreduce(np.full(5000, 1.0, np.float32))  # waits for the others
print("attached", flush=True)
time.sleep(60)
"""


def _victim(job_file, sock, what):
    return subprocess.Popen([sys.executable, "-c", LOCAL, job_file, sock, what], env=_env(),
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


def test_a_local_process_dying_fails_or_completes_the_call(tmp_path):
    """Local rank 1 killed before its call: local rank 0's waiting call fails at once naming it.
    Killed after its call: the host's call completes with its part (the call needs it at the
    other host), counted as a client lost. Alive but silent: local rank 0 fails after the
    daemon's timeout naming the missing local rank."""
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, 2, timeout=10.0) as (job_file, socks):
        sock = socks[0]
        victim = _victim(job_file, sock, "wait")
        try:
            assert victim.stdout.readline() == "attached\n"
            with DaemonClient(job_file, 0, sock, local_rank=0, local_size=2) as c0, \
                    concurrent.futures.ThreadPoolExecutor(1) as pool:
                fut = pool.submit(c0.allreduce, np.ones(5000, np.float32))
                until(lambda: status(sock)["local_waiting"] == 1, "local rank 0's call", 20)
                victim.kill()
                # the leave's own message: the 10 s timeout would name a missing local rank
                with pytest.raises(SpinaError, match=r"allreduce: local rank 1 \(pid \d+\) went "
                                                     "away before its call; this call fails"):
                    fut.result(timeout=30)
        finally:
            victim.kill()
            victim.wait()
            victim.stdout.close()
        victim = _victim(job_file, sock, "call")
        try:
            until(lambda: status(sock)["local_waiting"] == 1, "the victim's call", 20)
            victim.kill()
            victim.wait()
            clients = [[DaemonClient(job_file, 0, sock, local_rank=0, local_size=2)],
                       [DaemonClient(job_file, 1, socks[1], local_rank=lr, local_size=2)
                        for lr in range(2)]]
            outs = _allreduce_all(clients, [np.full(5000, v, np.float32) for v in (2, 3, 4)])
            for o in outs:  # the dead process's 1.0 is in
                np.testing.assert_array_equal(o, np.full(5000, 10.0, np.float32))
            until(lambda: status(sock)["clients_lost"] == 1, "the loss to be counted", 20)
            for row in clients:
                for c in row:
                    c.close()
        finally:
            if victim.poll() is None:
                victim.kill()
                victim.wait()
            victim.stdout.close()
        # a silent local rank 1 (attached, never calling): local rank 0 times out
        with _hosts(tmp_path, sw, 1, job=2, timeout=1.0) as (job_file, (sock,)), \
                DaemonClient(job_file, 0, sock, local_rank=0, local_size=2) as c0, \
                DaemonClient(job_file, 0, sock, local_rank=1, local_size=2):
            with pytest.raises(SpinaError, match=r"allreduce: local ranks \[1\] did not call "
                                                 r"within 1 s"):
                c0.allreduce(np.ones(10, np.float32))


LEADER = """
import sys, numpy as np, torch, torch.distributed as dist
import collectives
from collectives.schedule import chunk_bounds
from host_agent.daemon import DaemonClient
rank, port, job_file, socks, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:6], \\
    sys.argv[6]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
total = 1001
b = chunk_bounds(total, 4)
full = np.random.default_rng(3).standard_normal(total).astype(np.float32)
agent = DaemonClient(job_file, rank, socks[rank]) if rank < 2 else None  # leaders 0, 1
got = collectives.all_gather(torch.from_numpy(full[b[rank]:b[rank + 1]]), total,
                             "leader-switch", groups=[[0, 2], [1, 3]], agent=agent)
np.save(out, got.numpy())
print("stats", agent.last_gather_stats.shard_bytes if agent else 0, flush=True)
dist.destroy_process_group()
"""


def test_the_hierarchical_all_gather_reaches_the_switch_through_the_daemons(tmp_path):
    """collectives' "leader-switch" with each group's leader a DaemonClient (groups {0, 2},
    {1, 3}; leaders 0 and 1 on two hosts' daemons): every one of 4 ranks holds the whole
    tensor bit for bit, and the leaders' shards (their group's two chunks, 1001 float32 in
    four chunks) went through the switch."""
    from collectives.schedule import chunk_bounds
    from spina.net import free_port
    full = np.random.default_rng(3).standard_normal(1001).astype(np.float32)
    with UdpSwitch(port=0) as sw, _hosts(tmp_path, sw, 2) as (job_file, socks):
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-c", LEADER, str(r), str(port), job_file,
                                   *socks, str(tmp_path / f"r{r}.npy")], env=_env(), cwd=ROOT,
                                  stdout=subprocess.PIPE, text=True) for r in range(4)]
        try:
            outs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        assert [p.returncode for p in procs] == [0] * 4, outs
        b = chunk_bounds(1001, 4)
        longest = max(b[g + 1] - b[g] + b[g + 3] - b[g + 2] for g in (0, 1))
        assert [o.split()[-1] for o in outs] == [str(4 * longest)] * 2 + ["0"] * 2
        for r in range(4):
            assert np.load(tmp_path / f"r{r}.npy").tobytes() == full.tobytes(), r
        assert sw.packets_in >= 2  # a shard of each leader
        assert [status(s)["calls_done"] for s in socks] == [1, 1]
