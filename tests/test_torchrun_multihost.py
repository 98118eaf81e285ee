"""Multi-host torchrun (issue 30 item 8): N hosts each running one `torchrun --nnodes N
--node_rank K` node, one switch, one controller, as README.md's multi-host recipe says.

Run just this file: .venv/bin/python -m pytest tests/test_torchrun_multihost.py   (needs root)

Two namespaced hosts with two training processes each, the L2 software switch on their veths
(`python -m softswitch l2 --grpc`), `controller serve` programming it and answering the run
rendezvous on the hosts' management bridge, where torchrun's own rendezvous (node 0's
address) and gloo run too. Every process takes its assignment from the one setting
`SPINA_JOB_FILE=.../job3-rank{rank}.json` and its per-call timeout from `SPINA_TIMEOUT`.
"""
from __future__ import annotations

import subprocess

import pytest

from spina import spec
from spina.net import free_ports
from tests.deployment import ENV, ROOT, Deployment
from tests.netns import MGMT_IP, SWITCH_IP

NODES, PER_NODE = 2, 2
TORCHRUN = str(ROOT / ".venv" / "bin" / "torchrun")


def job_doc(sw_grpc: str, rendezvous: str) -> dict:
    """One switch s0 (port k: host k), NODES x PER_NODE workers (rank r on host r // PER_NODE
    at UDP port 50000 + r), one job 3 of them all at the P4 program's sizes."""
    n = NODES * PER_NODE
    workers = [{"name": f"w{r}", "ip": f"10.0.0.{r // PER_NODE + 1}", "udp_port": 50000 + r,
                "switch_port": r // PER_NODE + 1, "mac": f"02:00:00:00:01:{r // PER_NODE:02x}"}
               for r in range(n)]
    return {"switches": [{"name": "s0", "target": "softswitch", "grpc": sw_grpc,
                          "address": SWITCH_IP, "udp_port": spec.INA_UDP_PORT,
                          "ports": list(range(1, NODES + 1))}],
            "workers": workers,
            "jobs": [{"id": 3, "members": [w["name"] for w in workers], "nslots": 8,
                      "slot_base": 0, "block_size": 32, "nlanes": 4}],
            "agents_dir": "agents", "rendezvous": rendezvous}


@pytest.mark.parametrize("hosts", [NODES], indirect=True)
def test_torchrun_nodes_on_two_hosts_train_through_one_switch(managed_hosts, tmp_path):
    """Each host runs its torchrun node of examples/train_digits.py (one epoch, DDP with the
    SpINA hook): both nodes exit 0, rank 0 reports the weights identical on all 4 ranks and
    the SpINA calls its hook made."""
    if not (ROOT / ".venv" / "bin" / "torchrun").exists():
        pytest.skip(f"{TORCHRUN} missing: make setup installs torch")
    grpc, rdv, master = free_ports(3)
    doc = job_doc(f"127.0.0.1:{grpc}", f"{MGMT_IP}:{rdv}")
    dep = Deployment("l2", doc, tmp_path, l2_interfaces={"s0": [s for _, s in managed_hosts]})
    env = dict(ENV, SPINA_JOB_FILE=str(tmp_path / "agents" / "job3-rank{rank}.json"),
               SPINA_TIMEOUT="25", GLOO_SOCKET_IFNAME="mgmt0", OMP_NUM_THREADS="1")
    nodes = []
    try:
        dep.start()
        for k, (ns, _) in enumerate(managed_hosts):
            nodes.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, TORCHRUN, "--nnodes", str(NODES), "--node_rank",
                 str(k), "--nproc_per_node", str(PER_NODE), "--master_addr", "10.9.0.1",
                 "--master_port", str(master), str(ROOT / "examples" / "train_digits.py"),
                 "--epochs", "1", "--out", str(tmp_path / "digits.png")],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=240)[0] for p in nodes]
        for k, (p, out) in enumerate(zip(nodes, outs)):
            assert p.returncode == 0, f"node {k}:\n{out[-3000:]}"
        final = [line for line in outs[0].splitlines() if "final test accuracy" in line]
        assert len(final) == 1, outs[0][-3000:]
        assert "weights identical across ranks: True" in final[0], final[0]
        spina = final[0].split("SpINA: ", 1)[1]
        assert "'calls': " in spina and "'calls': 0," not in spina, spina
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
        dep.stop()
