"""A torch.distributed backend named "spina": float SUM all-reduces go through SpINA.

    import host_agent.torch_backend  # registers the backend
    dist.init_process_group("spina")  # under torchrun, with $SPINA_JOB_FILE set

Every all-reduce of CPU float32/float16/bfloat16 tensors with ReduceOp.SUM travels through
the switch (`host_agent.hooks.common.sum_async`); everything else (broadcast, all-gather,
barrier, other reduce ops, int tensors) is forwarded to a gloo process group built on the
same store. DDP then needs no hook: its default bucket all-reduce is a float SUM.

The hook is the recommended integration (see examples/README.md for the comparison): it
touches only gradient buckets, keeps the process group a stock gloo one, and keeps
parameter boundaries (block alignment). The backend catches every float SUM all-reduce of
the program, including small bookkeeping ones where a round trip through the switch buys
nothing, and relies on a Python `dist.ProcessGroup` subclass, an interface PyTorch marks as
private.
"""
import torch
import torch.distributed as dist

# A Python process group needs these private names; PyTorch's own Python process groups
# (torch.testing._internal.distributed) import them from the same place.
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _create_work_from_future,
)
from torch.distributed.constants import default_pg_timeout

from host_agent.assignment import agent_from_env
from host_agent.hooks.common import sum_async

BACKEND = "spina"
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


class SpinaProcessGroup(dist.ProcessGroup):
    """Process group: SpINA for float SUM all-reduce, gloo for the rest.

    Args:
        store, rank, world_size, timeout: as torch.distributed hands them to a backend.
    """

    def __init__(self, store, rank: int, world_size: int, timeout):
        super().__init__(rank, world_size)
        self._rank, self._world = rank, world_size
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size,
                                          timeout)
        # init_process_group(timeout=) bounds each SpINA call too; torch's default (it
        # passes one always) leaves the agent's: $SPINA_TIMEOUT, else 30 s.
        given = timeout is not None and timeout != default_pg_timeout
        self.agent = agent_from_env(rank=rank,
                                    timeout=timeout.total_seconds() if given else None)
        self.spina_calls = 0

    def getBackendName(self):
        return BACKEND

    def size(self):
        return self._world

    def allreduce(self, tensors, opts=AllreduceOptions()):
        if (opts.reduceOp != dist.ReduceOp.SUM
                or any(t.dtype not in _FLOATS or t.device.type != "cpu" for t in tensors)):
            return self.gloo.allreduce(tensors, opts)
        futs = [sum_async(self.agent, t) for t in tensors]
        self.spina_calls += len(tensors)
        done = torch.futures.Future()

        def copy_back(_):
            try:
                for t, f in zip(tensors, futs):
                    t.copy_(f.value())
                done.set_result(tensors)
            except Exception as e:
                done.set_exception(e)

        torch.futures.collect_all(futs).add_done_callback(copy_back)
        return _create_work_from_future(done)

    # Everything else: gloo.
    def broadcast(self, tensors, opts=BroadcastOptions()):
        return self.gloo.broadcast(tensors, opts)

    def allgather(self, outputs, inputs, opts=AllgatherOptions()):
        return self.gloo.allgather(outputs, inputs, opts)

    def _allgather_base(self, output, input, opts=AllgatherOptions()):
        return self.gloo._allgather_base(output, input, opts)

    def barrier(self, opts=BarrierOptions()):
        return self.gloo.barrier(opts)

    def reduce(self, tensors, opts=ReduceOptions()):
        return self.gloo.reduce(tensors, opts)

    def gather(self, outputs, inputs, opts=GatherOptions()):
        return self.gloo.gather(outputs, inputs, opts)

    def scatter(self, outputs, inputs, opts=ScatterOptions()):
        return self.gloo.scatter(outputs, inputs, opts)

    def reduce_scatter(self, outputs, inputs, opts=ReduceScatterOptions()):
        return self.gloo.reduce_scatter(outputs, inputs, opts)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,
                      opts=AllToAllOptions()):
        return self.gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def send(self, tensors, dst, tag=0):
        return self.gloo.send(tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        return self.gloo.recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self.gloo.recv_anysource(tensors, tag)


def _create(store, rank, world_size, timeout):
    return SpinaProcessGroup(store, rank, world_size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


__all__ = ["SpinaProcessGroup", "BACKEND"]
