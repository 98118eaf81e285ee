"""DLCP under congestion: step time of one gradient all-reduce per step, exact vs bounded loss,
fixed vs layer priorities, and gloo, over the same congested queue (docs/dlcp.md).

The parts of the harness's `dlcp` WHAT (bench/dlcp.py: its options, columns and outputs).
Run from the repository root as root (`make bench-dlcp` does):

    python -m bench dlcp                                        # the documented run (2.5 min)
    python -m bench dlcp -g 2 --model 64,64,10 -n 2 --out /tmp/d           # smoke

The fabric (namespaces: the file bench/topologies/dlcp_leaf16.yaml, built and removed by
fabric.py with spina/netgraph.py's Graph):

```
  w0 eth0 -tbf-+                               +- core: IPv4 router between the workers'
  w1 eth0 -tbf-+ leaf: L2-mode software switch |  subnets (gloo's ring), SpINA's aggregator
  ...          + (softswitch.l2), its uplink  -+  (UDP-mode software switch) on its address
  bg eth0 -tbf-+ rate-limited (--port-rate)    |  there, a blackhole for the background traffic
```

Every frame a worker sends goes through the leaf's uplink to the core (the leaf bridges by MAC
and every worker's next hop is the core): SpINA's contributions on their way to the aggregator,
and gloo's TCP ring (worker -> core -> worker). The uplink's egress is the one congested port:
the leaf's per-priority queues (softswitch/egress.py), tail drop at 64 frames per queue,
enq_qdepth measured, and the DLCP congestion drop with the job's loss budget (the `congestion`
entry the controller writes, set here per mode). By default (`--uplink shaper`) the port is
one link of `--port-rate` (bits/s on the wire) with strict priority between its queues, and a
frame's link time is taken when it leaves egress, so a frame the congestion drop takes uses
none: a real port. `--uplink bmv2` is BMv2's traffic manager instead (the first run in
docs/dlcp.md): each priority queue drained at `--queue-rate` frames a second on its own, the
drop decided after the frame's departure slot. The background sender (its own namespace)
sends UDP open loop at `--background` frames a second of `--bg-size` bytes through the same
uplink to a blackholed address at the core:
non-INA frames, so priority 0, the queue SpINA's loss-tolerant packets (and, with priority
policy `fixed`, all of them) and gloo share. Worker links are limited by tbf both ways.

`--train STEPS` measures time to accuracy instead: every worker trains an MLP on
scikit-learn's digits (`--train-model`, default 64,1024,512,10), its own shard, one
all-reduce per layer per step, through the same fabric, one configuration after another;
rank 0 evaluates every `--eval-every` steps (the clock stops meanwhile). Outputs
dlcp_train.csv (per configuration: the seconds and steps to `--target-accuracy`, the
losses), dlcp_train_curves.csv, dlcp_train.png.

Per step, every worker all-reduces one gradient of an MLP (`--model` widths), one call per
layer in backward order (last layer first, as DDP's buckets), each with its layer position
(`layer=(i, n)`, 0 = the first layer, needed first by the next forward pass). Configurations,
interleaved step by step (the order rotating each repeat), in the same processes:

  exact/fixed, exact/layer                bounded_loss 0 (priority_policy fixed, layer)
  exact/own-queue                         a control: exact, the job's priority 1, so every
                                          packet in a queue of its own (not the background's)
  b1%/fixed, b1%/layer, b10%/fixed, ...   bounded_loss 0.01, 0.1, loss_tolerant_policy magnitude
                                          (loss deadline: --loss-deadline)
  b1%/fixed/auto, ..., b10%/layer/auto    the same with loss_deadline auto (from the measured
                                          round latency)
  gloo                                    torch.distributed gloo all_reduce, in place, per layer

A step's time is the slowest worker's (barriers around it). Checked per step: SpINA's results
bit-identical on every rank; rank 0 counts the blocks of each call's result that differ from
the exact float64 sum by more than the quantization bound (exact modes: none, else the step
is wrong, `wrong_step`; bounded modes: recorded with `within_bound`, floor(bound x the call's
blocks)); gloo within float32 rounding. Recorded per step: CallStats (blocks lost, partial
rounds, loss-tolerant packets, resends), the leaf's congestion drops and tail drops, the load
average. Outputs in --out: dlcp_steps.csv (every step), dlcp_congestion.csv (per
configuration), dlcp_summary.md, dlcp_congestion.png.

The package, one module per purpose: `configs.py` (the configurations and the CSV columns),
`fabric.py` (the namespaces and their addresses), `switches.py` (the leaf, the aggregator and
the background sender, each a process in its namespace), `worker.py` (a worker process: its
agent and gloo group, the timed step, the training loop), `model.py` (the MLP: layer sizes,
the synthetic gradients, the numpy forward and backward; the data is examples/digits.py's),
`run.py` (the fabric and the processes for one run), `report.py` (rows, CSV, summary, plots)
and `cli.py` (the options of `python -m bench dlcp`).
"""
from __future__ import annotations

from bench.dlcp_bench.configs import COLUMNS, CONFIGS, DEFAULT_CONFIGS, Config

__all__ = ["COLUMNS", "CONFIGS", "DEFAULT_CONFIGS", "Config"]
