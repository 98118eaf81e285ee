"""p4runtime-shell, an independent P4Runtime client, against the software switch's server.

Run just this file: python -m pytest tests/test_p4runtime_shell.py
"""
from __future__ import annotations

import p4runtime_sh.shell as sh
import pytest
import yaml

from controller import state as state_mod
from controller.controller import Controller
from controller.p4rt import NotPrimaryError
from softswitch.p4runtime_server import P4RuntimeServer
from softswitch.udp import UdpSwitch


@pytest.fixture
def deployed(tmp_path):
    """A UDP software switch with P4Runtime, job 7 deployed by our controller; all stopped after."""
    sw = UdpSwitch("127.0.0.1", 0).start()
    srv = P4RuntimeServer(sw.dataplane, "127.0.0.1:0", servicer=sw.servicer()).start()
    doc = {"switches": [{"name": "s1", "target": "softswitch", "grpc": srv.address}],
           "workers": [{"name": f"w{i}", "ip": "127.0.0.1", "udp_port": 52000 + i,
                        "switch_port": 0} for i in range(2)],
           "jobs": [{"id": 7, "members": ["w0", "w1"], "nslots": 2, "slot_base": 0}]}
    p = tmp_path / "spina.yaml"
    p.write_text(yaml.safe_dump(doc))
    ctl = Controller(state_mod.load(p))
    ctl.deploy()
    yield sw, srv, ctl
    ctl.close()
    srv.stop()
    sw.stop()


@pytest.fixture
def shell(deployed):
    """p4runtime-shell connected with a higher election id than our controller's."""
    _, srv, _ = deployed
    sh.setup(device_id=0, grpc_addr=srv.address, election_id=(0, 9), verbose=False)
    yield sh
    sh.teardown()


def test_shell_reads_tables_groups_and_counters(deployed, shell):
    """The shell fetches the P4Info and reads what the controller wrote and the counters."""
    sw, _, _ = deployed
    sw.pipeline.counters["job_received"][7] = 3
    assert shell.client.api_version() == "1.4.1"
    admission = list(shell.TableEntry("admission").read())
    assert len(admission) == 2
    assert {e.action.action_name for e in admission} == {"admit"}
    assert len(list(shell.TableEntry("worker_rewrite").read())) == 2
    ce = shell.CounterEntry("job_received")
    ce.index = 7
    assert [c.data.packet_count for c in ce.read()] == [3]
    (g,) = list(shell.MulticastGroupEntry(8).read())
    assert sorted(r.instance for r in g.msg().multicast_group_entry.replicas) == [225, 226]


def test_shell_as_primary_writes_and_controller_refuses(deployed, shell):
    """The shell (election id 9) is primary: its insert lands; our controller (1) refuses. A
    row the UDP mode cannot honour (frame forwarding) is refused by name."""
    import socket

    import grpc
    sw, _, ctl = deployed
    e = shell.TableEntry("ina_endpoint")(action="accept_ina")
    e.match["dst_addr"] = "10.9.9.9"
    e.insert()
    assert socket.inet_aton("10.9.9.9") in sw.dataplane.ina_endpoint
    bridge = shell.TableEntry("l2")(action="bridge")
    bridge.match["dst_mac"] = "02:00:00:00:00:09"
    bridge.action["port"] = "3"
    with pytest.raises(grpc.RpcError, match="table l2: the UDP mode forwards no frames"):
        bridge.insert()
    assert sw.dataplane.l2 == {}
    with pytest.raises(NotPrimaryError):
        ctl.deploy()
