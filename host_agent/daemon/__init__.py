"""The host agent daemon: one long-lived process per host owns the network side of SpINA.

    python -m host_agent daemon --config /etc/spina/agent.json

Training processes on the host come and go; the daemon keeps the agents (their UDP sockets
and per-slot round counters) for every (job, rank) a local process has attached to. A client
talks to it over a Unix-domain stream socket and hands tensors over in shared memory:

    client                                      daemon (one thread per connection)
    attach {job_file, rank[,           ──▶      load the job file, create/reuse the Agent
            local_rank, local_size]}
                                       ◀──      {ok, job, nworkers}
    write tensor into its shm segment
    allreduce {shm, dtype, n[, layer_index, layer_count]}
                                       ──▶      map the segment (once), Agent.allreduce on a
                                                numpy view of it, write the sum back in place
                                       ◀──      {ok, stats}
    read the sum from the segment
    write its shard at the segment's start
    allgather {shm, n}                 ──▶      Agent.allgather of the shard (n bytes), every
                                                process's shard written into the segment
                                       ◀──      {ok, stats}
    read the shards (process p's at bytes p*n..)
    write the tensor into the segment
    reduce_scatter {shm, dtype, n}     ──▶      Agent.reduce_scatter of the tensor, this
                                                process's shard of the sum written at the
                                       ◀──      segment's start; {ok, stats}
    read the shard (torch.chunk's split over every process)

Hierarchical reduction: L processes on the host attach with {job_file, rank, local_rank,
local_size} as local ranks 0..L-1 of one rank of the job (the job file's workers are then the
hosts). The daemon waits for all L requests of a call, sums their segments on the host, makes
the rank's one agent call (the switch sees one contribution per host: 1/L of the packets and
bytes) and writes the same result into all L segments. An all-gather of the L local ranks
joins their shards into the host's one shard, gathers the hosts' through the switch, and
gives every local segment all H x L shards; a reduce-scatter sums them as an all-reduce and
gives each local segment its process's shard. `hier.py` says how the float sum keeps
today's semantics (the headroom covers all hosts x L processes) and what a local process
that dies or stays silent does to the others' call (it completes or fails; it never hangs).

Messages are 4-byte big-endian lengths followed by JSON. A client that dies mid-call costs
nothing but that call: the daemon finishes the all-reduce (the other ranks need it), finds the
connection gone when it replies, drops the connection's mappings and frees the rank for the
next process. Several connections and several jobs are served at once; one (job, rank) runs
one call at a time (its agent's lock).

The package keeps the two sides apart: `protocol.py` (framing, the request table), `server.py`
(`DaemonConfig`, `Daemon`, `main`: the daemon process; `hier.py` its local ranks' gathering and
host sum) and `client.py` (`DaemonClient`, `status`: what a training process imports). The
names below load their module when first asked for, so `from host_agent.daemon import
DaemonClient` never imports the server.
"""
from __future__ import annotations

from spina.lazy import lazy_names

_OWNERS = {
    "DEFAULT_SOCKET": "protocol", "MAX_MESSAGE": "protocol", "REQUESTS": "protocol",
    "BadMessage": "protocol", "check_request": "protocol", "recv_msg": "protocol",
    "send_msg": "protocol",
    "DaemonClient": "client", "status": "client",
    "Daemon": "server", "DaemonConfig": "server", "main": "server",
}


__getattr__, __dir__ = lazy_names(__name__, _OWNERS, globals())

__all__ = sorted(_OWNERS)
