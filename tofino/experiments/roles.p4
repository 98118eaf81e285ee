/* Pieces of the fabric roles (p4src/v1model/fabric.p4) on Tofino 1, each in a minimal TNA
 * pipeline, compiled to read what bf-p4c says (tofino/README.md, "The hold and the roles on
 * Tofino 1"; tests/test_tna_agreement.py compiles each where bf-p4c is on PATH). Not part of
 * the program; the program's roles profile (tofino/spina_tna_roles.p4) is the whole.
 *   -DVARIANT=1: slot_count with the fourth RegisterAction a leaf needs to store its spine's
 *                result (count_store: nlocal -> nlocal + 1, beside count_first, count_rank,
 *                count_duplicate): fits
 *   -DVARIANT=2: a pair register with a fifth RegisterAction (a store beside set, clear, add,
 *                read_hi): refused (four per register), so the leaf's store is the pairs' SET
 *   -DVARIANT=3: p4src's test of the rack's bit in the spine's bitmap, a shift by the rack
 *                (a field): refused; the profile gets 1 << rack as action data (job_level)
 *   -DVARIANT=4: a spine ORing a partial's MISMATCH and PARTIAL into slot_flags in the
 *                stateful ALU (value | flag_bits | carried, two inputs): fits
 *   -DVARIANT=5: VARIANT 1 with a fresh copy's count as an input (nworkers for a spine
 *                adopting a REPLAY): refused, a stateful ALU takes 2 PHV inputs (nworkers,
 *                the flush limit); the profile adopts a replay with count_duplicate instead
 */
#include <core.p4>
#include <tna.p4>

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header h_t { bit<32> a; bit<32> b; bit<8> rack; bit<8> flags; bit<16> idx; }
struct hdr_t { eth_t eth; h_t h; }
struct md_t { bit<32> nworkers; bit<32> limit; bit<32> first; bit<32> answer; bit<8> bits; bit<8> carried; }
struct pair_t { bit<32> lo; bit<32> hi; }

parser RolesParser(packet_in p, out hdr_t hdr, out md_t m, out ingress_intrinsic_metadata_t ig) {
    state start {
        p.extract(ig);
        p.advance(PORT_METADATA_SIZE);
        p.extract(hdr.eth);
        p.extract(hdr.h);
        transition accept;
    }
}

control Roles(inout hdr_t hdr, inout md_t m, in ingress_intrinsic_metadata_t ig,
              in ingress_intrinsic_metadata_from_parser_t prsr,
              inout ingress_intrinsic_metadata_for_deparser_t dprsr,
              inout ingress_intrinsic_metadata_for_tm_t tm) {
#if VARIANT == 1 || VARIANT == 5
    Register<bit<32>, bit<8>>(256) slot_count;
    RegisterAction<bit<32>, bit<8>, bit<32>>(slot_count) count_first = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = 0 - m.nworkers;
#if VARIANT == 5
            value = m.first;  // 1, or nworkers for a spine adopting a REPLAY: a third input
#else
            value = 1;
#endif
        }
    };
    RegisterAction<bit<32>, bit<8>, bit<32>>(slot_count) count_rank = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value - m.nworkers;
            if (value < m.nworkers) {
                value = value + 1;
            }
        }
    };
    RegisterAction<bit<32>, bit<8>, bit<32>>(slot_count) count_duplicate = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value - m.nworkers;
            if (value < m.limit) {
                value = m.limit;
            }
        }
    };
    RegisterAction<bit<32>, bit<8>, bit<32>>(slot_count) count_store = {
        void apply(inout bit<32> value, out bit<32> rv) {
            rv = value - m.nworkers;
            if (value == m.nworkers) {
                value = value + 1;
            }
        }
    };
    apply {
        m.nworkers = (bit<32>)hdr.h.rack;
        m.limit = hdr.h.b;
        m.first = hdr.h.a;
        if (hdr.h.flags == 0) {
            m.answer = count_first.execute(hdr.h.idx[7:0]);
        } else if (hdr.h.flags == 1) {
            m.answer = count_rank.execute(hdr.h.idx[7:0]);
        } else if (hdr.h.flags == 2) {
            m.answer = count_duplicate.execute(hdr.h.idx[7:0]);
        } else {
            m.answer = count_store.execute(hdr.h.idx[7:0]);
        }
        hdr.h.a = m.answer;
        tm.ucast_egress_port = ig.ingress_port;
    }
#elif VARIANT == 2
    Register<pair_t, bit<8>>(256) pair;
    RegisterAction<pair_t, bit<8>, bit<32>>(pair) pair_set = {
        void apply(inout pair_t value, out bit<32> rv) {
            value.lo = hdr.h.a;
            value.hi = hdr.h.b;
            rv = value.lo;
        }
    };
    RegisterAction<pair_t, bit<8>, bit<32>>(pair) pair_clear = {
        void apply(inout pair_t value, out bit<32> rv) {
            value.lo = 0;
            value.hi = 0;
            rv = 0;
        }
    };
    RegisterAction<pair_t, bit<8>, bit<32>>(pair) pair_add = {
        void apply(inout pair_t value, out bit<32> rv) {
            value.lo = value.lo + hdr.h.a;
            value.hi = value.hi + hdr.h.b;
            rv = value.lo;
        }
    };
    RegisterAction<pair_t, bit<8>, bit<32>>(pair) pair_read_hi = {
        void apply(inout pair_t value, out bit<32> rv) {
            rv = value.hi;
        }
    };
    RegisterAction<pair_t, bit<8>, bit<32>>(pair) pair_store = {
        void apply(inout pair_t value, out bit<32> rv) {
            value.lo = hdr.h.a;
            value.hi = hdr.h.b;
            rv = value.hi;
        }
    };
    apply {
        if (hdr.h.flags == 0) {
            hdr.h.a = pair_set.execute(hdr.h.idx[7:0]);
        } else if (hdr.h.flags == 1) {
            hdr.h.a = pair_clear.execute(hdr.h.idx[7:0]);
        } else if (hdr.h.flags == 2) {
            hdr.h.a = pair_add.execute(hdr.h.idx[7:0]);
        } else if (hdr.h.flags == 3) {
            hdr.h.b = pair_read_hi.execute(hdr.h.idx[7:0]);
        } else {
            hdr.h.b = pair_store.execute(hdr.h.idx[7:0]);
        }
        tm.ucast_egress_port = ig.ingress_port;
    }
#elif VARIANT == 3
    apply {
        // p4src: (hdr.ina.bitmap >> meta.fab.rack)[0:0] == 1
        if ((hdr.h.a >> hdr.h.rack)[0:0] == 1) {
            hdr.h.b = 1;
        }
        tm.ucast_egress_port = ig.ingress_port;
    }
#else
    Register<bit<8>, bit<8>>(256) slot_flags;
    RegisterAction<bit<8>, bit<8>, bit<8>>(slot_flags) flags_or = {
        void apply(inout bit<8> value, out bit<8> rv) {
            value = value | m.bits | m.carried;
            rv = value;
        }
    };
    apply {
        m.bits = hdr.h.flags & 0x04;
        m.carried = hdr.h.flags & 0x18;
        hdr.h.flags = flags_or.execute(hdr.h.idx[7:0]);
        tm.ucast_egress_port = ig.ingress_port;
    }
#endif
}

control RolesDeparser(packet_out p, inout hdr_t hdr, in md_t m,
                      in ingress_intrinsic_metadata_for_deparser_t dprsr) {
    apply { p.emit(hdr); }
}

struct no_hdr_t {}
struct no_md_t {}
parser NoParser(packet_in p, out no_hdr_t h, out no_md_t m, out egress_intrinsic_metadata_t eg) {
    state start { p.extract(eg); transition accept; }
}
control NoEgress(inout no_hdr_t h, inout no_md_t m, in egress_intrinsic_metadata_t eg,
                 in egress_intrinsic_metadata_from_parser_t prsr,
                 inout egress_intrinsic_metadata_for_deparser_t dprsr,
                 inout egress_intrinsic_metadata_for_output_port_t oport) { apply {} }
control NoDeparser(packet_out p, inout no_hdr_t h, in no_md_t m,
                   in egress_intrinsic_metadata_for_deparser_t dprsr) { apply {} }

Pipeline(RolesParser(), Roles(), RolesDeparser(), NoParser(), NoEgress(), NoDeparser()) pipe;
Switch(pipe) main;
