"""The training process's side of the daemon: `DaemonClient` and `status`.

A training process imports this module, never the server (host_agent/daemon/server.py): the
client needs the protocol, the job file and numpy's view of a shared-memory segment only.
"""
from __future__ import annotations

import os
import socket
from multiprocessing import shared_memory

import numpy as np

from host_agent import dlcp
from host_agent.agent import CallStats, SpinaError
from host_agent.allgather import GatherStats
from host_agent.daemon.protocol import DEFAULT_SOCKET, recv_msg, send_msg
from spina.config import JobFile


class DaemonClient:
    """A training process's handle on the daemon; quacks like `Agent` for the torch hook.

    Args:
        job_file: the job file (spina.config.JobFile) of the job to join.
        rank: this process's rank in it (with local ranks: the host's rank).
        socket_path: the daemon's Unix socket.
        local_rank, local_size: this process is local rank `local_rank` of the `local_size`
            processes on this host that together are `rank` (hierarchical reduction,
            host_agent/daemon/hier.py): the daemon sums them on the host and sends one
            contribution. None: this process alone is `rank`.

    Example:
        >>> c = DaemonClient("/tmp/spina-job.json", rank=0)   # doctest: +SKIP
        >>> c.allreduce(np.ones(1000, np.float32))           # doctest: +SKIP
    """

    def __init__(self, job_file: str, rank: int, socket_path: str = DEFAULT_SOCKET,
                 local_rank: int | None = None, local_size: int | None = None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(socket_path)
        attach = {"op": "attach", "job_file": os.path.abspath(job_file), "rank": rank,
                  "pid": os.getpid()}
        if local_rank is not None:
            attach["local_rank"] = local_rank
        if local_size is not None:
            attach["local_size"] = local_size
        send_msg(self.sock, attach)
        try:
            reply = self._reply()
        except SpinaError:
            self.sock.close()
            raise
        self.job = JobFile.from_dict(reply["job"]).job
        self.rank = rank
        self.process = rank * (local_size or 1) + (local_rank or 0)  # in the job's processes
        # the processes a sum is over: the job's ranks are hosts (the DDP hooks average by it:
        # hooks.common.processes_summed)
        self.world_size = self.job.nworkers * (local_size or 1)
        self.last_stats = CallStats()
        self.last_gather_stats = GatherStats()
        self._shm: shared_memory.SharedMemory | None = None
        self._executor = None

    def _reply(self) -> dict:
        reply = recv_msg(self.sock)
        if reply is None:
            raise SpinaError("the daemon closed the connection")
        if not reply.get("ok"):
            raise SpinaError(reply.get("error", "daemon error"))
        return reply

    def allreduce(self, x, inplace: bool = False, layer=None):
        """Element-wise sum over the job's ranks (float32 or int32 numpy; torch via numpy).

        inplace: also write the sum into `x` (as Agent.allreduce does). layer: (i, n), the
        tensor's layer position for DLCP priorities (Agent.allreduce)."""
        layer = dlcp.check_layer(layer)
        req = {} if layer is None else dict(layer_index=layer[0], layer_count=layer[1])
        arr, out = self._summed(x, "allreduce", req, lambda n: (0, n))
        if inplace and not _is_torch(x):
            arr[...] = out.reshape(arr.shape)
        return self._back(x, arr, out.reshape(arr.shape))

    def reduce_scatter(self, x, blocks=None):
        """This process's shard of the element-wise sum over every process (as
        Agent.reduce_scatter: torch.chunk's split of the flat tensor, FSDP2's; with local ranks
        over the job's ranks x local_size processes, process rank x local_size + local_rank).
        float32 or int32 numpy, torch via numpy; a 1-d array back. `blocks`, Agent's hint of
        the blocks that may be non-zero, is only a hint: the daemon finds them itself."""
        del blocks
        from host_agent.scatter import shard_bounds
        arr, out = self._summed(x, "reduce_scatter", {},
                                lambda n: shard_bounds(n, self.world_size, self.process))
        return self._back(x, arr, out)

    def _summed(self, x, op: str, req: dict, part):
        """(x as numpy, the elements `part(n)` = [lo, hi) of what the daemon's `op` wrote
        into the segment, a copy)."""
        if _is_torch(x):
            import torch
            arr = x.detach().to(torch.int32 if x.dtype == torch.int32 else torch.float32).numpy()
        else:
            arr = np.asarray(x)
        dtype = np.dtype(np.int32) if arr.dtype == np.int32 else np.dtype(np.float32)
        n = arr.size
        view = np.ndarray((n,), dtype, buffer=self._segment(n * 4).buf)
        view[:] = arr.reshape(-1)
        send_msg(self.sock, {"op": op, "shm": self._shm.name, "n": n, "dtype": dtype.name,
                             **req})
        reply = self._reply()
        self.last_stats = CallStats(**reply["stats"])
        lo, hi = part(n)
        out = view[:hi - lo].copy()  # the daemon wrote this process's part at the start
        del view
        return arr, out

    @staticmethod
    def _back(x, arr: np.ndarray, out: np.ndarray):
        """`out` as the caller's kind: torch of x's dtype, else numpy of arr's."""
        if _is_torch(x):
            import torch
            return torch.from_numpy(out).to(x.dtype)
        return out.astype(arr.dtype, copy=False)

    def allgather(self, x):
        """Every process's `x`, stacked: shape (world_size, *x.shape), x's dtype, row p bit
        for bit what process p passed (as Agent.allgather; with local ranks the processes are
        ordered rank x local_size + local_rank, host_agent/daemon/hier.py). numpy or torch."""
        if _is_torch(x):
            import torch
            t = x.detach().contiguous().cpu()
            got = self.allgather(t.reshape(-1).view(torch.uint8).numpy())
            return torch.from_numpy(got).view(t.dtype).reshape(
                (self.world_size,) + tuple(t.shape)).to(x.device)
        arr = np.ascontiguousarray(x)
        n = arr.nbytes
        seg = self._segment(n * self.world_size)
        view = np.ndarray((n * self.world_size,), np.uint8, buffer=seg.buf)
        view[:n] = arr.reshape(-1).view(np.uint8)
        send_msg(self.sock, {"op": "allgather", "shm": seg.name, "n": n})
        reply = self._reply()
        self.last_gather_stats = GatherStats(**reply["stats"])
        out = view.copy().view(arr.dtype).reshape((self.world_size,) + arr.shape)
        del view
        return out

    def _segment(self, nbytes: int) -> shared_memory.SharedMemory:
        """This client's shared-memory segment, grown to at least `nbytes` (never 0)."""
        nbytes = max(nbytes, 4)
        if self._shm is None or self._shm.size < nbytes:
            if self._shm is not None:
                self._shm.close()
                self._shm.unlink()
            self._shm = shared_memory.SharedMemory(create=True, size=nbytes)
        return self._shm

    def allreduce_async(self, x, inplace: bool = False, layer=None):
        if self._executor is None:
            import concurrent.futures
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="spina-client")
        return self._executor.submit(self.allreduce, x, inplace, layer)

    def status(self) -> dict:
        send_msg(self.sock, {"op": "status"})
        return self._reply()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.sock.close()
        if self._shm is not None:
            self._shm.close()
            self._shm.unlink()
            self._shm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def status(socket_path: str = DEFAULT_SOCKET) -> dict:
    """The daemon's counters, without attaching to a job."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(socket_path)
        send_msg(s, {"op": "status"})
        return recv_msg(s)


__all__ = ["DaemonClient", "status"]
