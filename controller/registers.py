"""Register access per target. Tables, counters and multicast groups always go through
P4Runtime; registers do not everywhere:

- software switch: P4Runtime register entries (`P4RuntimeRegisters`).
- BMv2 simple_switch_grpc: its P4Runtime server answers UNIMPLEMENTED to register reads and
  writes (checked on 1.15.5), so registers go through its Thrift runtime on port 9090, here by
  the `simple_switch_CLI` program that ships with BMv2 (`ThriftRegisters`; bmv2_tests use
  it too: the one Thrift client).
- Tofino: P4Runtime register entries (`TofinoRegisters`) with the TNA program's empty values
  and its extra slot_rank_round register. Stratum serves them (a MODIFY per index, or every
  index without one); the SDE's PI-based server in bf_switchd answers UNIMPLEMENTED, as
  simple_switch_grpc does (both run p4lang/PI's P4Runtime frontend). Unverified on a switch.

Slots recycle themselves in the data plane (a newer round resets a copy), so clearing is only
needed when a job is removed or reset: the next job on those slots must not see an old round.
"""
from __future__ import annotations

import shutil
import subprocess

import grpc
from p4.v1 import p4runtime_pb2 as pb

from controller.p4rt import Connection, P4InfoIndex, P4RuntimeError
from controller.tofino import bitwidth
from spina import spec
from spina.p4runtime import decode


class RegisterAdapter:
    """Read and clear slot registers by their P4 names."""

    def clear(self, names: list[str], start: int, count: int) -> None:
        """Zero cells start..start+count-1 of every register in `names`."""
        raise NotImplementedError

    def read(self, name: str, index: int) -> int:
        raise NotImplementedError

    def read_cells(self, name: str, start: int, count: int) -> list[int]:
        """Cells start..start+count-1 of `name` (one request where the target allows)."""
        return [self.read(name, i) for i in range(start, start + count)]

    def reset(self, names: list[str]) -> None:
        """Zero every cell of every register in `names`."""
        raise NotImplementedError


class P4RuntimeRegisters(RegisterAdapter):
    """Register entries over the controller's P4Runtime connection (the software switch).
    Subclasses say which registers a clear touches, where, and with what (TofinoRegisters)."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def empty(self, name: str) -> int:
        """A cleared cell's value."""
        return 0

    def selected(self, names) -> list[str]:
        """The registers a clear or reset of `names` writes."""
        return list(names)

    def cells(self, name: str, start: int, count: int) -> range:
        """The cells of `name` that hold slot copies start..start+count-1."""
        return range(start, start + count)

    def write(self, updates: list) -> None:
        self.conn.write(updates)

    def fill(self, data, r, value: int) -> None:
        """P4Data `data` for register `r` holding `value`: a bitstring, or for a struct cell
        (the TNA program's pair registers) every member holding it."""
        name = r.preamble.name.rsplit(".", 1)[-1]
        what = f"register {name!r}"
        if r.type_spec.HasField("struct"):
            struct = self.conn.index.p4info.type_info.structs[r.type_spec.struct.name]
            for m in struct.members:
                data.struct.members.add().bitstring = P4InfoIndex.encode(
                    value, bitwidth(m.type_spec), f"{what} member {m.name!r}", "registers", name)
        else:
            data.bitstring = P4InfoIndex.encode(value, r.type_spec.bitstring.bit.bitwidth, what,
                                                "registers", name)

    def clear(self, names, start, count):
        updates = []
        for name in self.selected(names):
            r = self.conn.index.get("registers", name)
            for i in self.cells(name, start, count):
                e = pb.Entity()
                e.register_entry.register_id = r.preamble.id
                e.register_entry.index.index = i
                self.fill(e.register_entry.data, r, self.empty(name))
                updates.append((pb.Update.MODIFY, e))
        self.write(updates)

    def read(self, name, index):
        e = pb.Entity()
        e.register_entry.register_id = self.conn.index.id("registers", name)
        e.register_entry.index.index = index
        got = self.conn.read([e])
        return decode(got[0].register_entry.data.bitstring) if got else 0

    def read_cells(self, name, start, count):
        rid = self.conn.index.id("registers", name)
        want = []
        for i in range(start, start + count):
            e = pb.Entity()
            e.register_entry.register_id = rid
            e.register_entry.index.index = i
            want.append(e)
        got = {g.register_entry.index.index: decode(g.register_entry.data.bitstring)
               for g in self.conn.read(want)}
        return [got.get(i, 0) for i in range(start, start + count)]

    def reset(self, names):
        updates = []
        for name in self.selected(names):  # no index: every cell (P4Runtime 9.6)
            r = self.conn.index.get("registers", name)
            e = pb.Entity()
            e.register_entry.register_id = r.preamble.id
            self.fill(e.register_entry.data, r, self.empty(name))
            updates.append((pb.Update.MODIFY, e))
        self.write(updates)


class ThriftRegisters(RegisterAdapter):
    """BMv2's Thrift runtime, through `simple_switch_CLI --thrift-port PORT` (one CLI session
    per call: the commands go on its standard input)."""

    def __init__(self, thrift_port: int = 9090, cli: str = "simple_switch_CLI"):
        self.thrift_port = thrift_port
        self.cli = cli

    def run(self, commands: list[str]) -> str:
        """Run simple_switch_CLI commands in one session; its output. Also what BMv2 offers
        only over Thrift besides registers (counter_reset, set_queue_rate in bmv2_tests)."""
        if shutil.which(self.cli) is None:
            raise RuntimeError(f"{self.cli} is not on PATH: BMv2 registers are reachable only "
                               "through its Thrift runtime")
        out = subprocess.run([self.cli, "--thrift-port", str(self.thrift_port)],
                             input="\n".join(commands) + "\n", capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0 or "Error" in out.stdout:
            raise RuntimeError(f"{self.cli}: {out.stdout.strip()[-400:]} {out.stderr.strip()}")
        return out.stdout

    def clear(self, names, start, count):
        self.run([f"register_write {n} {i} 0" for n in names
                   for i in range(start, start + count)])

    def read(self, name, index):
        return self.read_cells(name, index, 1)[0]

    def read_cells(self, name, start, count):  # one CLI session for all of them
        out = self.run([f"register_read {name} {i}" for i in range(start, start + count)])
        got = [int(line.rsplit("=", 1)[1].strip()) for line in out.splitlines()
               if "=" in line and name in line]
        if len(got) != count:
            raise RuntimeError(f"register_read {name} {start}..{start + count - 1}: "
                               f"{out.strip()[-400:]}")
        return got

    def reset(self, names):
        self.run([f"register_reset {n}" for n in names])


class TofinoRegisters(P4RuntimeRegisters):
    """The TNA program's registers over P4Runtime (tofino/README.md, spina/spec.py):

    - written: the named registers that the switch's P4Info declares (the TNA program lacks
      some of p4src's slot registers), plus `slot_rank_round` when it declares that;
    - empty values: FLAG_LAST in `slot_flags` (the TNA program stores LAST inverted,
      spec.TNA_FLAGS_INVERTED), zero elsewhere, each as wide as the P4Info says (the lane
      bitmaps slot_present and slot_nonfinite are 32-bit cells there; the value registers
      slot_values_l0_p<P> are pairs, P4 structs of two 32-bit halves, both zeroed);
    - `slot_rank_round` has one cell per slot copy and rank at copy * 32 + rank
      (`meta.rank_idx` in tofino/include/slot_index.p4: slot ++ round[0] ++ rank), so
      copies start..start+count-1 own cells start * 32 .. (start + count) * 32 - 1.

    Needs a P4Info with standard register entries (bf-p4c --p4runtime-force-std-externs).
    """

    RANK_REGISTER = spec.TNA_RANK_REGISTER.name
    RANKS = spec.TNA_SIZES["MAX_WORKERS"]

    def empty(self, name: str) -> int:
        return spec.TNA_FLAGS_INVERTED if name == "slot_flags" else 0

    def selected(self, names) -> list[str]:
        """`names` the P4Info declares, then slot_rank_round if it declares it and some
        per-copy slot register is cleared with it (its cells go with the slot copies; the
        per-slot head register, head_round in the Tofino 2 profile only, is cleared apart)."""
        out = [n for n in names if self.conn.index.has("registers", n)
               and n != self.RANK_REGISTER]
        per_copy = any(n not in spec.HEAD_REGISTERS for n in out)
        return out + ([self.RANK_REGISTER] if per_copy and self.conn.index.has(
            "registers", self.RANK_REGISTER) else [])

    def cells(self, name, start, count):
        if name == self.RANK_REGISTER:
            return range(start * self.RANKS, (start + count) * self.RANKS)
        return super().cells(name, start, count)

    def write(self, updates: list) -> None:
        try:
            self.conn.write(updates)
        except P4RuntimeError as e:
            if e.code == grpc.StatusCode.UNIMPLEMENTED:
                raise P4RuntimeError(
                    f"{e}: this P4Runtime server does not write registers (the SDE's "
                    "bf_switchd PI server does not; Stratum does)", e.code) from None
            raise


def adapter_for(target: str, conn: Connection, thrift_port: int = 9090) -> RegisterAdapter:
    if target == "softswitch":
        return P4RuntimeRegisters(conn)
    if target == "bmv2":
        return ThriftRegisters(thrift_port)
    if target == "tofino":
        return TofinoRegisters(conn)
    raise ValueError(f"unknown target {target!r}")
