"""Packet captures of SpINA traffic: decode them with scapy, write them for tests.

    python -m spina.capture spina.pcap [--port 47000]     # one line per INA packet
    spina capture spina.pcap                              # the same

    >>> from spina.capture import rdpcap                  # doctest: +SKIP
    >>> pkts = rdpcap("spina.pcap")                       # doctest: +SKIP
    >>> pkts[0][wire.scapy_layer()].call                  # doctest: +SKIP

Importing this module binds scapy's `INA` layer (spina/wire.py) to the default INA port,
so scapy's own `rdpcap` decodes captures too; a deployment on another port passes it
(`rdpcap(path, ports=(47001,))`). Capture with any libpcap tool, for example
`tshark -i lo -f "udp port 47000" -w spina.pcap` (docs/operations.md); the Wireshark
dissector for the same header is docs/spina.lua (spina/dissector.py generates it).
"""
from __future__ import annotations

import argparse
import os
import sys

from spina import cli, wire


def bind(ports=(wire.DEFAULT_UDP_PORT,)):
    """Bind the scapy INA layer to each UDP port in `ports`; returns the layer class."""
    layer = None
    for p in ports:
        layer = wire.scapy_layer(p)
    return layer


def rdpcap(path: str, ports=(wire.DEFAULT_UDP_PORT,)):
    """scapy's rdpcap with the INA layer bound to `ports`: INA payloads come back decoded."""
    from scapy.utils import rdpcap as scapy_rdpcap
    bind(ports)
    return scapy_rdpcap(path)


def wrpcap(path: str, datagrams) -> None:
    """Write INA datagrams as Ethernet/IPv4/UDP frames: `datagrams` holds
    ((src_ip, src_port), (dst_ip, dst_port), payload) triples (tests and examples)."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import wrpcap as scapy_wrpcap
    scapy_wrpcap(path, [Ether() / IP(src=s[0], dst=d[0]) / UDP(sport=s[1], dport=d[1])
                        / Raw(bytes(p)) for s, d, p in datagrams])


def summary(pkt, layer, ports=None) -> str | None:
    """One line for a captured frame holding an INA packet (None for anything else);
    `layer` is the INA class `bind` returned. With `ports`, only UDP to or from one of them
    counts: scapy's bindings accumulate for the process (this module binds the default port on
    import), so a layer alone would also decode the ports the caller did not ask for."""
    if layer not in pkt:
        return None
    from scapy.layers.inet import IP, UDP
    if ports is not None and not (UDP in pkt and {pkt[UDP].sport, pkt[UDP].dport} & set(ports)):
        return None
    ina = pkt[layer]
    flags = ",".join(n for b, n in wire.FLAG_NAMES.items() if int(ina.flags) & b) or "-"
    where = (f"{pkt[IP].src}:{pkt[UDP].sport} > {pkt[IP].dst}:{pkt[UDP].dport} "
             if IP in pkt and UDP in pkt else "")
    return (f"{where}{wire.MSG_NAMES.get(ina.msg_type, ina.msg_type)} job={ina.job} "
            f"epoch={ina.epoch} call={ina.call} rank={ina.rank} slot={ina.slot} "
            f"round={ina.round} flags={flags} lanes={bin(ina.present).count('1')}/{ina.nlanes} "
            f"block_size={ina.block_size} length={ina.length} exponent={ina.exponent}")


DESCRIPTION = ("Decode a packet capture (pcap/pcapng, e.g. from tshark or tcpdump): one line "
               "per SpINA packet with its header fields; other packets are counted.")


def parser(prog: str = "python -m spina.capture") -> argparse.ArgumentParser:
    """The capture command's arguments (`spina capture` adds -c)."""
    ap = cli.ArgumentParser(prog=prog, description=DESCRIPTION)
    ap.add_argument("file", type=cli.input_file, help="capture file")
    ap.add_argument("--port", type=cli.udp_port, action="append", metavar="PORT",
                    help=f"INA UDP port (repeatable; default {wire.DEFAULT_UDP_PORT})")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    return decode(args.file, args.port or (wire.DEFAULT_UDP_PORT,))


def decode(path: str, ports, prog: str = "spina capture") -> int:
    """Print one line per INA packet of the capture at `path` (INA: UDP to or from one of
    `ports`), the count of the others on stderr, and a hint if no packet was INA; exit code."""
    from scapy.error import Scapy_Exception
    from scapy.utils import rdpcap as scapy_rdpcap
    layer, other = bind(ports), 0
    try:
        pkts = scapy_rdpcap(path)
    except (OSError, Scapy_Exception) as e:  # Scapy_Exception: not a capture file
        print(f"{prog}: error: {path}: {e}", file=sys.stderr)
        return 2
    try:
        for p in pkts:
            line = summary(p, layer, ports)
            if line is None:
                other += 1
            else:
                print(line)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 0
    print(f"{len(pkts) - other} SpINA packets, {other} other", file=sys.stderr)
    if pkts and other == len(pkts):
        print(f"{prog}: no packet to or from UDP port {', '.join(map(str, sorted(ports)))}: "
              "if the switch listens on another, pass --port PORT (spina capture -c FILE "
              "takes the desired state's)", file=sys.stderr)
    return 0


bind()

if __name__ == "__main__":
    sys.exit(main())
