"""The controller against real BMv2 (simple_switch_grpc with p4src/): P4Runtime for tables and
groups, the Thrift runtime for registers. Skips, saying why, without p4c/BMv2 or root.

Run just this file (as root, with p4c-bm2-ss, simple_switch_grpc, simple_switch_CLI on PATH):
    python -m pytest tests/test_controller_bmv2.py
"""
from __future__ import annotations

import pytest
import yaml

from bmv2_tests import bmv2, helpers as h
from controller import state as state_mod
from controller.controller import Controller
from controller.registers import ThriftRegisters

pytestmark = pytest.mark.skipif(bmv2.unavailable() is not None,
                                reason=bmv2.unavailable() or "")


@pytest.fixture
def bmv2_switch():
    """simple_switch_grpc on veth pairs (bmv2_tests' target); stopped afterwards."""
    t = bmv2.Bmv2Target()
    yield t
    t.close()


def test_deploy_aggregate_remove_on_bmv2(bmv2_switch, tmp_path):
    """Deploy pushes p4c's pipeline and the job; two frames aggregate; removal clears slots."""
    t = bmv2_switch
    doc = {"switches": [{"name": "s1", "target": "bmv2", "grpc": t.grpc_addr,
                         "thrift_port": t.thrift_port, "address": h.SWITCH_IP,
                         "udp_port": h.INA_PORT, "ports": [1, 2, 3, 4],
                         "p4info": str(t.tmp / "spina_v1model.p4info.txtpb"),
                         "device_config": str(t.tmp / "spina_v1model.json")}],
           "workers": [{"name": f"w{r}", "ip": h.worker_ip(r), "udp_port": h.worker_udp(r),
                        "switch_port": h.worker_port(r), "mac": h.worker_mac(r)}
                       for r in (0, 1)],
           "jobs": [{"id": h.JOB, "members": ["w0", "w1"], "nslots": 4, "slot_base": 0,
                     "block_size": h.BS, "nlanes": h.K}]}
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    st = state_mod.load(p)
    with Controller(st, election=2) as c:  # the target's own session holds election id 1
        assert isinstance(c.session("s1").registers, ThriftRegisters)
        assert c.deploy()[0].pipeline_pushed
        assert not c.deploy()[0].changed
        t.send(1, h.contrib(0, slot=1, round=1, blocks={0: [1] * h.BS}))
        t.send(2, h.contrib(1, slot=1, round=1, blocks={0: [2] * h.BS}))
        assert sorted(port for port, _ in t.received(1.0)) == [1, 2]
        assert t.register("slot_round", 3) == 1
        assert c.status()[0]["job_aggregated"] == 2
        c.set_state(st.without_job(h.JOB))
        assert t.register("slot_round", 3) == 0
