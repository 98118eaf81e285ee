"""The processes in the fabric's other namespaces: the leaf switch with the congested uplink,
SpINA's aggregator at the core, and the background sender that loads the uplink."""
from __future__ import annotations

import time

from bench.dlcp_bench.configs import JOB
from bench.dlcp_bench.fabric import BLACKHOLE
from spina import spec


def leaf_main(conn, ns: str, ports: dict, l2: dict, uplink_port: int, uplink: tuple,
              qdepth: int) -> None:
    """The leaf switch in namespace `ns`: L2 bridging, the uplink (`uplink_port`, to the core)
    rate-limited: `uplink` is
    ("shaper", PortRate) (a port shaper: one link rate, strict priority, link time taken after
    egress) or ("bmv2", pps) (BMv2's model: each priority queue at its own rate). Commands on
    `conn`: ("bound", fraction) sets the job's congestion entry (0: none, never dropped);
    "counters" -> (congestion drops, seen, tail drops) so far; "stop"."""
    try:
        from softswitch.dataplane import Dataplane
        from softswitch.l2 import L2Switch
        from spina import spec
        from spina.netns import enter
        enter(ns)
        dp = Dataplane(pool_slots=1)
        for mac, port in l2.items():
            dp.table_add("l2", {"dst_mac": mac}, "bridge", {"port": port})
        if uplink[0] == "shaper":
            dp.set_port_rate(uplink_port, uplink[1])
        else:
            dp.set_queue_rate(uplink_port, uplink[1])
        sw = L2Switch(ports, dp).start()
        conn.send("ready")
    except BaseException as e:
        conn.send(dict(error=f"leaf: {type(e).__name__}: {e}"))
        raise
    lock = dp.pipeline.lock
    try:
        while True:
            cmd = conn.recv()
            if cmd == "stop":
                break
            if cmd == "counters":
                with lock:
                    c = dp.counters
                    conn.send((int(c["job_congestion_drops"][JOB]),
                               int(c["job_congestion_seen"][JOB]), dp.queues.tail_drops))
            else:
                _, fraction = cmd
                with lock:  # the entry the controller's CongestionDrop writes for this job
                    if spec.loss_bound(fraction):
                        dp.table_add("congestion", {"job": JOB}, "set_congestion",
                                     {"qdepth": qdepth, "bound": spec.loss_bound(fraction)})
                    else:
                        dp.table_delete("congestion", {"job": JOB})
                conn.send("ok")
    finally:
        sw.stop()


def aggregator_main(conn, ns: str, address: str) -> None:
    """SpINA's UDP-mode software switch in the core namespace on `address` and the INA UDP port
    (the port by which the leaf's parser knows an INA packet: its priority, its congestion
    drop). Protocol: send our address; receive the JobConfig, admit it; "stop"."""
    import threading

    from softswitch.udp import UdpSwitch
    from spina.netns import enter
    try:
        enter(ns)
        sw = UdpSwitch(address, spec.INA_UDP_PORT)
        conn.send(sw.address)
        sw.add_job(conn.recv())
        conn.send("admitted")
    except BaseException as e:
        conn.send(dict(error=f"aggregator: {type(e).__name__}: {e}"))
        raise
    t = threading.Thread(target=sw.serve_forever, name="aggregator")
    t.start()
    try:
        conn.recv()  # "stop"
    except EOFError:
        pass
    sw.shutdown()
    t.join()
    sw.sock.close()


def background_main(conn, ns: str, address: str, pps: float, size: int) -> None:
    """Open-loop UDP at `pps` datagrams a second from the background namespace to the core's
    blackhole, paced per millisecond, until "stop" (answers the datagrams sent)."""
    import socket

    from spina.netns import enter
    enter(ns)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((address, 0))
    s.setblocking(False)
    payload = bytes(size)
    sent = 0
    conn.send("ready")
    t0 = time.perf_counter()
    while not conn.poll(0):
        due = int((time.perf_counter() - t0) * pps)
        while sent < due:
            try:
                s.sendto(payload, (BLACKHOLE, 9))
            except (BlockingIOError, OSError):  # full qdisc: the frame is lost, as on a link
                pass
            sent += 1
        time.sleep(0.001)
    conn.recv()
    conn.send(sent)
    s.close()
