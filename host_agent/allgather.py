"""All-gather through the switch: each worker sends its shard once, the switch replicates every
packet to the job's other workers (docs/protocol.md "All-gather").

One call (`GatherCall`), per worker, with S the shard's bytes padded to whole 4-byte words and
blocks of the job's block_size words, C = the job's nlanes blocks per chunk:

  chunks     chunk c of this worker's shard (blocks c*C .. c*C+C-1; the last chunk's absent lanes
             have no present bit, the last block is zero-padded) goes to the switch as a
             MSG_GATHER packet with `round` = c, `rank` = this worker, `length` = the shard's
             words, the job's slot_base, nlanes and block_size (the switch admits it as it
             admits a contribution). The data are the shard's bytes as they are: nothing is
             quantized, so every rank gets the others' shards bit for bit.
  window     chunk c leaves once chunks 0 .. c-W have arrived from every other worker (W: the
             job's nslots, the all-reduce's window): at most W chunks per worker in flight.
  loss       the switch stores nothing. A worker asks the owners of what it misses: a
             MSG_GATHER packet with `bitmap` = the owners, `round` = the chunk, no data. The
             switch replicates it like any gather packet; each owner named resends the chunk
             (to everyone: the others drop the duplicate). It asks at once for a gap, a chunk
             of an owner missing below one that arrived (an owner's chunks leave in order
             and take one path through the switch: a gap is a loss; a reordering network
             costs a duplicate), and for anything else it misses after hearing nothing new
             for a while (a lost last chunk, a lost request or answer).
  after      a worker returns once it holds every shard, while another may still miss one of
             its chunks. So it keeps its last call (`GatherCall.between`) and answers requests
             for it wherever it next reads its socket: in its next all-gather call, inside an
             all-reduce call (the agent's answer loop hands gather packets over), and between
             calls (the agent's responder thread). Chunks of the next call that arrive before
             it starts are kept for it. A worker is never more than one call ahead of another:
             neither collective completes without every worker.

Everything here is per packet (header fields, one copy of the packet's bytes), never per
element.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from spina import wire
from spina.config import JobConfig

EARLY_MAX = 4096  # chunks of the next call kept before it starts (a window per rank is enough)
_UNPACK, _PACK_INTO = wire.HEADER_STRUCT.unpack_from, wire.HEADER_STRUCT.pack_into
(_MSG_TYPE, _JOB, _EPOCH, _CALL, _RANK, _NLANES, _ROUND, _LENGTH, _BLOCK_SIZE, _BITMAP,
 _PRESENT) = (wire.FIELD_INDEX[f] for f in (
    "msg_type", "job", "epoch", "call", "rank", "nlanes", "round", "length", "block_size",
    "bitmap", "present"))
FIRST_ASK = 0.02  # s without news before the first request: a chunk's trip is ~0.1-5 ms here
LAST_ASK = 0.5    # s: the gap doubles while requests go unanswered, up to this
# s: requests for a chunk within this of its last resend are answered by that one (a rank whose
# copy of it was lost asks again after FIRST_ASK)
ANSWER_AGAIN = 0.005


class GatherError(RuntimeError):
    """An all-gather that cannot complete: silence past the timeout (`timed_out`; `missing`:
    the ranks it still waits for) or a shard of another size (`missing`: its rank)."""

    def __init__(self, msg: str, missing: list[int], timed_out: bool):
        super().__init__(msg)
        self.missing, self.timed_out = missing, timed_out


@dataclass
class GatherStats:
    """What one all-gather call put on the wire (this worker) and got back."""
    shard_bytes: int = 0
    packets_sent: int = 0
    bytes_sent: int = 0        # whole UDP payloads
    resends: int = 0           # chunks sent again on a request
    requests: int = 0          # requests sent (a packet each)
    packets_received: int = 0
    bytes_received: int = 0
    duplicates: int = 0        # chunks received again
    ignored: int = 0           # other calls' packets, results, requests not for us
    malformed_packets: int = 0
    foreign_packets: int = 0
    seconds: float = 0.0


class Shard:
    """One worker's shard as the chunks it sends: the bytes padded to whole blocks."""

    def __init__(self, job: JobConfig, data: np.ndarray):
        self.nbytes = data.nbytes
        self.words = -(-self.nbytes // 4)
        if self.words >= 1 << 32:
            raise ValueError(f"shard of {self.nbytes} bytes exceeds the 32-bit length field")
        bs, k = job.block_size, job.nlanes
        self.block_bytes = 4 * bs
        nblocks = -(-self.words // bs)
        self.nchunks = -(-nblocks // k)
        self.chunk_bytes = k * self.block_bytes
        self.padded = np.zeros(nblocks * self.block_bytes, np.uint8)
        self.padded[:self.nbytes] = data.reshape(-1).view(np.uint8)
        self.nblocks, self.nlanes = nblocks, k

    def lanes(self, c: int) -> int:
        """Blocks chunk `c` carries (its first lanes)."""
        return min(self.nlanes, self.nblocks - c * self.nlanes)

    def present(self, c: int) -> int:
        return (1 << self.lanes(c)) - 1

    def rows(self, c: int) -> memoryview:
        at = c * self.chunk_bytes
        return memoryview(self.padded)[at:at + self.lanes(c) * self.block_bytes]


class GatherCall:
    """One all-gather call of rank `rank` (its switch rank on the wire). After it returns it
    keeps answering requests for its chunks (`between`)."""

    def __init__(self, job: JobConfig, rank: int, call_id: int, shard: Shard,
                 previous: GatherCall | None = None):
        self.job, self.rank, self.call_id, self.shard = job, rank, call_id, shard
        self.previous = previous  # this worker's last call: still asked for
        n = job.nworkers
        self.out = np.empty((n, shard.nbytes), np.uint8)
        self.out[rank] = shard.padded[:shard.nbytes]
        self.have = np.zeros((n, shard.nchunks), bool)
        self.have[rank] = True
        self.got = np.ones(shard.nchunks, np.int64)  # per chunk: ranks it arrived from
        self.highest = np.full(n, -1, np.int64)  # per owner: its highest chunk arrived here
        self.missing = (n - 1) * shard.nchunks
        self.complete = 0 if n > 1 else shard.nchunks  # chunks 0..complete-1 from everyone
        self.sent = 0                                   # chunks 0..sent-1 left at least once
        self.answered: dict[int, float] = {}  # chunk -> when it was last sent again
        self.window = job.nslots
        self.stats = GatherStats(shard_bytes=shard.nbytes)
        self.outbox: list[bytes] = []
        self.early: list[bytes] = []  # chunks of the next call, received before it started
        self._head = bytearray(wire.HEADER_LEN + 4 * job.nlanes)
        self._pos = np.frombuffer(self._head, wire.NEXT_DTYPE, job.nlanes, wire.HEADER_LEN)

    # ------------------------------------------------------------------ sending
    def _packet(self, rnd: int, present: int, rows=b"", bitmap: int = 0) -> bytes:
        job, k = self.job, self.job.nlanes
        _PACK_INTO(self._head, 0, wire.VERSION, wire.MSG_GATHER, 0, 0, job.job, job.epoch,
                   self.call_id, job.slot_base, self.rank, k, rnd, self.shard.words,
                   job.block_size, 0, bitmap, present, 0)
        # next[i]: the shard block lane i carries (END: none), for captures and debugging
        lanes = present.bit_count()
        self._pos[:] = wire.END
        self._pos[:lanes] = np.arange(rnd * k, rnd * k + lanes)
        return bytes(self._head) + bytes(rows)

    def chunk(self, c: int) -> bytes:
        return self._packet(c, self.shard.present(c), self.shard.rows(c))

    def send_due(self) -> None:
        """Chunks the window allows now."""
        last = min(self.shard.nchunks, self.complete + self.window)
        while self.sent < last:
            self.outbox.append(self.chunk(self.sent))
            self.sent += 1

    def ask(self) -> int:
        """Requests for what is missing in the first window of incomplete chunks, one per
        chunk naming its owners: the chunk that holds the window (`complete`) and the gaps
        below an owner's highest chunk that arrived (lost: a later one came). A chunk above
        that may still be on its way (queued at a slow link), and asking for it would only
        send it twice. Returns how many requests."""
        asked = 0
        for c in range(self.complete, min(self.shard.nchunks, self.complete + self.window)):
            owners = np.flatnonzero(~self.have[:, c] & ((c < self.highest) | (c == self.complete)))
            if len(owners):
                self.outbox.append(self._packet(c, 0, bitmap=_bits(owners)))
                asked += 1
        self.stats.requests += asked
        return asked

    def _ask_gap(self, owner: int, first: int, stop: int) -> None:
        """Requests to `owner` for its chunks first..stop-1 not here (lost: a later one came)."""
        for c in range(first, stop):
            if not self.have[owner, c]:
                self.outbox.append(self._packet(c, 0, bitmap=1 << owner))
                self.stats.requests += 1

    # ------------------------------------------------------------------ receiving
    def _fields(self, pkt, nbytes: int) -> tuple | None:
        """The header of a well-formed gather packet of this job from another rank, or None
        (counted: malformed, or ignored)."""
        st = self.stats
        if nbytes < wire.HEADER_LEN:
            st.malformed_packets += 1
            return None
        t = _UNPACK(pkt)
        if wire.header_error(t, nbytes) is not None:
            st.malformed_packets += 1
            return None
        job = self.job
        if (t[_MSG_TYPE] != wire.MSG_GATHER or t[_JOB] != job.job or t[_EPOCH] != job.epoch
                or t[_NLANES] != job.nlanes or t[_BLOCK_SIZE] != job.block_size
                or t[_RANK] >= job.nworkers or t[_RANK] == self.rank):
            st.ignored += 1
            return None
        return t

    def take(self, pkt, nbytes: int) -> bool:
        """One datagram from the switch during the call; whether it brought a new chunk."""
        st = self.stats
        st.packets_received += 1
        st.bytes_received += nbytes
        t = self._fields(pkt, nbytes)
        if t is None:
            return False
        call, rnd, sender = t[_CALL], t[_ROUND], t[_RANK]
        if t[_BITMAP]:  # a request
            if not t[_BITMAP] >> self.rank & 1:
                st.ignored += 1
            elif call == self.call_id:
                self._answer(rnd)
            elif self.previous is not None and call == self.previous.call_id:
                prev = self.previous
                prev._answer(rnd)
                st.resends += len(prev.outbox)
                self.outbox += prev.outbox
                prev.outbox.clear()
            else:
                st.ignored += 1
            return False
        if call != self.call_id:
            self._keep_early(pkt, nbytes, call)
            return False
        shard = self.shard
        if t[_LENGTH] != shard.words:
            raise GatherError(f"job {self.job.job} all-gather call {call}: rank {sender}'s shard "
                              f"has {t[_LENGTH]} words, rank {self.rank}'s {shard.words}: every "
                              "rank must gather a shard of the same size", [sender], False)
        if rnd >= shard.nchunks or t[_PRESENT] != shard.present(rnd):
            st.malformed_packets += 1
            return False
        if self.have[sender, rnd]:
            st.duplicates += 1
            return False
        at = rnd * shard.chunk_bytes
        end = min(at + shard.chunk_bytes, shard.nbytes)
        self.out[sender, at:end] = np.frombuffer(pkt, np.uint8, end - at,
                                                 wire.data_offset(self.job.nlanes))
        self.have[sender, rnd] = True
        if rnd > self.highest[sender] + 1:  # a gap: chunks the owner sent before rnd were lost
            self._ask_gap(sender, int(self.highest[sender]) + 1, rnd)
        self.highest[sender] = max(self.highest[sender], rnd)
        self.missing -= 1
        self.got[rnd] += 1
        n = self.job.nworkers
        while self.complete < shard.nchunks and self.got[self.complete] == n:
            self.complete += 1
        return True

    def _keep_early(self, pkt, nbytes: int, call: int) -> None:
        """A chunk of the call after this one (a worker ahead): kept for that call."""
        if call == (self.call_id + 1) & 0xFFFFFFFF and len(self.early) < EARLY_MAX:
            self.early.append(bytes(pkt[:nbytes]))
        else:
            self.stats.ignored += 1

    def _answer(self, rnd: int) -> None:
        """A request naming this worker for chunk `rnd` of this call: sent again if it left,
        unless it was sent again less than ANSWER_AGAIN ago (to everyone: the other ranks that
        lost it ask at the same moment, at the same gap)."""
        now = time.monotonic()
        if rnd < self.sent and now - self.answered.get(rnd, -ANSWER_AGAIN) >= ANSWER_AGAIN:
            self.answered[rnd] = now
            self.outbox.append(self.chunk(rnd))
            self.stats.resends += 1

    def between(self, pkt, nbytes: int) -> None:
        """A gather packet that arrived after this call returned (in another call or between
        calls): a request for this call's chunks is answered (outbox), a chunk of the next
        call kept (early); anything else ignored."""
        t = self._fields(pkt, nbytes)
        if t is None:
            return
        if t[_BITMAP]:
            if t[_BITMAP] >> self.rank & 1 and t[_CALL] == self.call_id:
                self._answer(t[_ROUND])
            return
        self._keep_early(pkt, nbytes, t[_CALL])


def _bits(ranks) -> int:
    return sum(1 << int(r) for r in ranks)


def run(call: GatherCall, sock: socket.socket, switch: tuple[str, int], send, timeout: float
        ) -> np.ndarray:
    """Run `call` over the non-blocking socket `sock` until this worker holds every shard;
    `send(datagrams)` puts a batch on the wire to the switch. Returns call.out."""
    t0 = time.perf_counter()
    st = call.stats
    if not call.missing:  # one worker, or empty shards: nothing to send or wait for
        return call.out
    buf = bytearray(wire.MAX_UDP_PAYLOAD + 1)
    view = memoryview(buf)
    gap = FIRST_ASK
    last_news = time.monotonic()
    next_ask = last_news + gap
    call.send_due()
    early = call.previous.early if call.previous is not None else []
    for pkt in early:  # chunks that came before this call started
        if call.take(pkt, len(pkt)):
            call.send_due()
    early.clear()
    while True:
        if call.outbox:
            st.packets_sent += len(call.outbox)
            st.bytes_sent += sum(len(p) for p in call.outbox)
            send(call.outbox)
            call.outbox.clear()
        if not call.missing:
            break
        try:
            nbytes, src = sock.recvfrom_into(buf)
        except (BlockingIOError, InterruptedError):
            now = time.monotonic()
            if now - last_news >= timeout:
                waiting = np.flatnonzero(~call.have.all(axis=1)).tolist()
                raise GatherError(f"job {call.job.job} all-gather call {call.call_id}: nothing "
                                  f"from ranks {waiting} for {timeout:.1f} s", waiting,
                                  True) from None
            if now >= next_ask:  # silence: ask the owners again, and wait longer next time
                call.ask()
                gap = min(2 * gap, LAST_ASK)
                next_ask = now + gap
                continue
            select.select((sock,), (), (), next_ask - now)
            continue
        if src != switch:
            st.foreign_packets += 1
            continue
        if call.take(view, nbytes):
            last_news, gap = time.monotonic(), FIRST_ASK
            next_ask = last_news + gap
            call.send_due()
    st.seconds = time.perf_counter() - t0
    return call.out


class Gatherer:
    """An agent's all-gather side (Agent.allgather): its calls' numbering, its last call
    (which answers late requests for its chunks and keeps early chunks of the next call) and
    the responder thread that serves that call between calls.

    The agent's socket is one: every call (all-reduce or all-gather) holds `busy` while it
    reads it and clears `idle`; the responder reads it only between calls. Inside an
    all-reduce the agent's answer loop hands all-gather packets to `between`.

    Args:
        sock: the agent's UDP socket.
        switch: the switch's (numeric address, port): packets from anyone else are ignored.
        send: send(datagrams) puts a batch on the wire to the switch.
        busy, idle: the agent's call lock and its between-calls event.
        name: the responder thread's name.
    """

    def __init__(self, sock: socket.socket, switch: tuple[str, int], send,
                 busy: threading.RLock, idle: threading.Event, name: str):
        self.sock, self.switch, self.send = sock, switch, send
        self.name = name
        self.call_id = 0
        self.last: GatherCall | None = None
        self.stats = GatherStats()  # the last call's
        self._busy, self._idle = busy, idle
        self._closing = threading.Event()
        self._responder: threading.Thread | None = None

    def restart(self) -> None:
        """A new run or incarnation of the job: calls numbered afresh, the last one dropped."""
        self.call_id = 0
        self.last = None

    def start(self, job: JobConfig, rank: int, data: np.ndarray) -> GatherCall:
        """The next call of job rank `rank` (its switch rank on the wire) with shard `data`."""
        self.call_id = (self.call_id + 1) & 0xFFFFFFFF
        return GatherCall(job, job.switch_rank(rank), self.call_id, Shard(job, data), self.last)

    def run(self, call: GatherCall, timeout: float) -> np.ndarray:
        """Run `call` (the caller holds `busy`) until this worker holds every shard; it then
        becomes the last call. Raises GatherError as run() does."""
        sock = self.sock
        before = sock.gettimeout()
        sock.settimeout(0.0)
        try:
            out = run(call, sock, self.switch, self.send, timeout)
        finally:
            sock.settimeout(before)
            self.stats = call.stats
        call.previous = None  # one call back is all anyone can still ask for
        self.last = call
        return out

    def between(self, view, nbytes: int) -> None:
        """An all-gather packet outside an all-gather call: the last call answers it."""
        last = self.last
        if last is not None:
            last.between(view, nbytes)
            if last.outbox:
                self.send(last.outbox)
                last.outbox.clear()

    def serve(self) -> None:
        """Start the responder thread (once)."""
        if self._responder is None:
            self._responder = threading.Thread(target=self._serve_between, daemon=True,
                                               name=self.name)
            self._responder.start()

    def close(self) -> None:
        """Stop the responder thread (before the socket closes)."""
        self._closing.set()
        if self._responder is not None:
            self._responder.join()

    def _serve_between(self) -> None:
        """The responder thread: between calls, answer requests for the last all-gather's
        chunks (a worker that returned may be the only one holding what another lacks) and
        keep chunks of the next call that arrive early."""
        sock, buf = self.sock, bytearray(wire.MAX_UDP_PAYLOAD + 1)
        view = memoryview(buf)
        while not self._closing.is_set():
            self._idle.wait(0.2)
            try:
                ready = select.select((sock,), (), (), 0.05)[0]
            except (OSError, ValueError):  # closed under us
                return
            if not ready or not self._busy.acquire(blocking=False):
                continue  # nothing waiting, or a call started: it reads the socket now
            try:
                before = sock.gettimeout()
                sock.settimeout(0.0)
                while True:
                    try:
                        nbytes, src = sock.recvfrom_into(buf)
                    except (BlockingIOError, InterruptedError):
                        break
                    if src == self.switch and nbytes >= wire.HEADER_LEN \
                            and buf[1] == wire.MSG_GATHER:
                        self.between(view, nbytes)
                sock.settimeout(before)
            except OSError:  # closed under us
                return
            finally:
                self._busy.release()
