"""Captures decode: scapy's rdpcap and the generated Wireshark Lua dissector (docs/spina.lua).

Run just this file: .venv/bin/python -m pytest tests/test_capture.py
"""
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import yaml

from spina import capture, dissector, wire

ROOT = pathlib.Path(__file__).resolve().parents[1]
LUA = ROOT / "docs" / "spina.lua"
SWITCH, WORKER = ("127.0.0.1", wire.DEFAULT_UDP_PORT), ("127.0.0.1", 50001)


def _packets(n=6, seed=3):
    """n varied INA packets: (header, next, data, bytes)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        nlanes, bs = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        present = int(rng.integers(0, 1 << nlanes))
        h = wire.Header(msg_type=(wire.MSG_CONTRIB, wire.MSG_RESULT, wire.MSG_STATUS)[i % 3],
                        flags=int(rng.integers(0, 64)), priority=i % 8, job=1000 + i,
                        epoch=7 + i, call=0xFFFFFF00 + i, slot=300 + i, rank=i % 32,
                        nlanes=nlanes, round=2**31 + i, length=123456 + i, block_size=bs,
                        exponent=-130 + 60 * i, bitmap=int(rng.integers(0, 2**32)),
                        present=present, nonfinite=present & 1)
        nxt = rng.integers(0, 2**32, nlanes, dtype=np.uint64).astype(np.uint32)
        data = rng.integers(-2**31, 2**31, (bin(present).count("1"), bs)).astype(np.int32)
        out.append((h, nxt, data, wire.pack(h, nxt, data)))
    return out


def test_committed_dissector_is_the_generators_output():
    """docs/spina.lua is exactly what `python -m spina.dissector` prints (regenerate: make
    dissector)."""
    assert LUA.read_text() == dissector.lua()


def test_dissector_lists_every_field_at_its_struct_offset():
    """Each HEADER_FIELDS field is added once, at the offset and width struct gives it, with a
    ProtoField of that width and signedness."""
    text = LUA.read_text()
    added = re.findall(r"\bt:add\(F\.(\w+), buf\((\d+), (\d+)\)\)", text)
    declared = dict(re.findall(r"^F\.(\w+) = ProtoField\.(\w+)\(", text, re.M))
    expect, off = [], 0
    for name, code, bits in wire.HEADER_FIELDS:
        size = struct.calcsize(">" + code)
        assert size * 8 == bits
        expect.append((name, str(off), str(size)))
        kind = ("int" if code.islower() else "uint") + str(bits)  # struct: lower case = signed
        assert declared[name] == kind, name
        off += size
    header = [a for a in added if a[0] != "next"]
    assert header == expect
    assert f"local HEADER_LEN = {off}" in text
    assert f'DissectorTable.get("udp.port"):add({wire.DEFAULT_UDP_PORT}, spina)' in text


def test_tshark_decodes_a_scapy_written_capture_with_the_dissector(tmp_path):
    """tshark with docs/spina.lua reads every header field and next position of packets that
    scapy wrote into a pcap."""
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("tshark is not on PATH (Debian: apt-get install tshark; scripts/setup.sh "
                    "installs it as root)")
    pkts = _packets()
    pcap = tmp_path / "spina.pcap"
    capture.wrpcap(str(pcap), [(WORKER, SWITCH, p[3]) for p in pkts])
    cols = list(wire.FIELD_NAMES) + ["next"]
    cmd = [tshark, "-n", "-X", f"lua_script:{LUA}", "-r", str(pcap), "-T", "fields",
           "-E", "separator=/t"] + [x for c in cols for x in ("-e", f"spina.{c}")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    lines = out.strip().split("\n")
    assert len(lines) == len(pkts)
    for line, (h, nxt, _, _) in zip(lines, pkts):
        got = dict(zip(cols, line.split("\t")))
        for name in wire.FIELD_NAMES:
            assert int(got[name], 0) == getattr(h, name), (name, got[name])
        assert [int(v) for v in got["next"].split(",")] == nxt.tolist()


def test_rdpcap_decodes_captures_in_a_fresh_process(tmp_path):
    """After `import spina.capture`, scapy's own rdpcap returns INA layers with the fields and
    block values that were sent."""
    pkts = _packets()
    pcap = tmp_path / "spina.pcap"
    capture.wrpcap(str(pcap), [(WORKER, SWITCH, p[3]) if i % 2 else (SWITCH, WORKER, p[3])
                               for i, p in enumerate(pkts)])
    code = ("import sys, json; import spina.capture; from scapy.utils import rdpcap; "
            "from spina import wire; L = wire.scapy_layer(); "
            "print(json.dumps([{**{f: int(getattr(p[L], f)) for f in wire.FIELD_NAMES}, "
            "'next': list(p[L].next), 'data': p[L].block_values().tolist()} "
            "for p in rdpcap(sys.argv[1])]))")
    out = subprocess.run([sys.executable, "-c", code, str(pcap)], capture_output=True,
                         text=True, timeout=120, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    import json
    for got, (h, nxt, data, _) in zip(json.loads(out), pkts, strict=True):
        assert {f: got[f] for f in wire.FIELD_NAMES} == {f: getattr(h, f) for f in wire.FIELD_NAMES}
        assert got["next"] == nxt.tolist()
        assert np.array_equal(np.array(got["data"]).reshape(data.shape), data)


def test_capture_command_prints_one_line_per_ina_packet(tmp_path, capsys):
    """`spina capture FILE` prints each INA packet's fields and counts the other frames."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    h, nxt, data, raw = _packets(1)[0]
    pcap = tmp_path / "mixed.pcap"
    wrpcap(str(pcap), [Ether() / IP() / UDP(sport=1, dport=53) / b"dns?",
                       Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=5, dport=47001)
                       / raw])
    assert capture.main([str(pcap), "--port", "47001"]) == 0
    out, err = capsys.readouterr()
    flags = ",".join(n for b, n in wire.FLAG_NAMES.items() if h.flags & b) or "-"
    assert out.strip() == (f"10.0.0.1:5 > 10.0.0.2:47001 contrib job={h.job} epoch={h.epoch} "
                           f"call={h.call} rank={h.rank} slot={h.slot} round={h.round} "
                           f"flags={flags} lanes={bin(h.present).count('1')}/{h.nlanes} "
                           f"block_size={h.block_size} length={h.length} exponent={h.exponent}")
    assert "1 SpINA packets, 1 other" in err
    with pytest.raises(SystemExit) as e:  # checked by the option's type, before reading
        capture.main([str(tmp_path / "missing.pcap")])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("python -m spina.capture: error: argument file: "
                                       f"{tmp_path / 'missing.pcap'}: no such file\n")



def test_capture_port_filters_out_the_default_port(tmp_path, capsys):
    """`--port 47999` on a capture of port 47000 prints no packet and the hint naming 47999
    (issue 44 item 3: scapy's import-time binding to 47000 decoded them all, rc 0)."""
    raw = _packets(1)[0][3]
    pcap = tmp_path / "on47000.pcap"
    capture.wrpcap(str(pcap), [(WORKER, SWITCH, raw), (SWITCH, WORKER, raw)])
    assert capture.main([str(pcap), "--port", "47999"]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("0 SpINA packets, 2 other\nspina capture: no packet to or from UDP port 47999: "
                   "if the switch listens on another, pass --port PORT (spina capture -c FILE "
                   "takes the desired state's)\n")
    assert capture.main([str(pcap), "--port", "47999", "--port", "47000"]) == 0
    assert capsys.readouterr().out.count(" contrib job=") == 2


def test_spina_capture_takes_the_ina_ports_from_the_desired_state(tmp_path, capsys,
                                                                  monkeypatch):
    """`spina capture FILE -c spina.yaml` (or ./spina.yaml) decodes on every switch's UDP port;
    with no INA packet on the ports it used it says to pass --port; a bad port is refused.
    (Port 47123: scapy's bindings last for the process, and no other test binds it.)"""
    from spina_cli.main import main as spina
    raw = _packets(1)[0][3]
    pcap = tmp_path / "on47123.pcap"
    capture.wrpcap(str(pcap), [(("10.0.0.1", 5), ("10.0.0.2", 47123), raw)])
    monkeypatch.chdir(tmp_path)
    assert spina(["capture", str(pcap)]) == 0  # no desired state: the default port only
    out, err = capsys.readouterr()
    assert out == ""
    assert ("0 SpINA packets, 1 other\nspina capture: no packet to or from UDP port 47000: "
            "if the switch listens on another, pass --port PORT") in err
    with pytest.raises(SystemExit) as e:
        spina(["capture", str(pcap), "--port", "70000"])
    assert e.value.code == 2
    assert "argument --port: '70000' is not a UDP port (1..65535)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        spina(["capture", str(pcap), "-c", "none.yaml"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("spina capture: error: argument -c/--config: none.yaml: "
                                       "no such file\n")
    state = tmp_path / "elsewhere.yaml"
    state.write_text(yaml.safe_dump({
        "switches": [{"name": "s0", "target": "softswitch", "grpc": "127.0.0.1:1",
                      "address": "127.0.0.1", "udp_port": 47123}],
        "workers": [{"name": "w0", "ip": "127.0.0.1", "udp_port": 50000, "switch_port": 0}]}))
    assert spina(["capture", str(pcap), "-c", str(state)]) == 0
    out, err = capsys.readouterr()
    assert out.count(" contrib job=") == 1
    assert f"INA ports 47123 (the switches of {state})" in err and "1 SpINA packets, 0 other" in err
    state.rename(tmp_path / "spina.yaml")  # ./spina.yaml is the default desired state
    assert spina(["capture", str(pcap)]) == 0
    assert "INA ports 47123 (the switches of spina.yaml)" in capsys.readouterr().err


def test_capture_into_a_closed_pipe_stops_quietly(tmp_path):
    """`spina capture FILE | head -1`: one line through, then exit 0 with nothing on stderr
    (no BrokenPipeError traceback) once head has gone."""
    raw = _packets(1)[0][3]
    pcap = tmp_path / "many.pcap"
    capture.wrpcap(str(pcap), [(("10.0.0.1", 5), ("10.0.0.2", 47000), raw)] * 2000)
    cap = subprocess.Popen([sys.executable, "-m", "spina.capture", str(pcap)], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    head = subprocess.run(["head", "-1"], stdin=cap.stdout, capture_output=True, timeout=120)
    cap.stdout.close()
    err = cap.stderr.read().decode()
    assert cap.wait(timeout=120) == 0, err
    assert head.stdout.decode().count("\n") == 1 and " contrib job=" in head.stdout.decode()
    assert err == ""
