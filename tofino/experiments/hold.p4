/* The hold of a newer round (softswitch Pipeline._held, p4src/v1model/aggregator.p4) as one
 * Tofino 1 RegisterAction, compiled to read what bf-p4c says (tofino/README.md, "The hold and
 * the roles on Tofino 1"; tests/test_tna_agreement.py compiles it where bf-p4c is on PATH).
 * Not part of the program: a minimal TNA (or T2NA) pipeline around the one register.
 *
 * The hold's update reads and writes, in one step per packet, the slot's head round, which
 * ranks were heard at it and how many are missing: a newer round takes the slot only if every
 * other rank was heard, and then resets the set. On Tofino 1 one step on one register is one
 * stateful ALU: a cell of at most two 32-bit halves, 2 comparison units, and no test of a
 * bit chosen by the packet (a bitmap mask must be a constant).
 *   -DVARIANT=1: the ranks heard as a bitmap beside the round (the software's layout):
 *                the sender's bit is a packet-chosen mask, and the update needs 3 comparisons
 *   -DVARIANT=2: the count missing beside the round, the sender's "not heard yet" (0 or 1)
 *                given by an earlier stage: still 3 comparisons (same round, newer round,
 *                missing <= unheard); and no earlier stage can give it, since whether the
 *                sender was heard depends on the head round this register holds
 */
#include <core.p4>
#if __TARGET_TOFINO__ == 2
#include <t2na.p4>  // bf-p4c --target tofino2 --arch t2na (4 comparison units)
#else
#include <tna.p4>
#endif

header eth_t { bit<48> dst; bit<48> src; bit<16> type; }
header h_t { bit<32> round; bit<32> rank_bit; bit<8> rank; bit<8> nworkers; bit<16> others; }
struct hdr_t { eth_t eth; h_t h; }
struct md_t { bit<32> rank_bit; bit<32> others; bit<32> unheard; bit<32> nworkers_1; bit<8> held; }
struct heard_t { bit<32> round; bit<32> heard; }
struct pending_t { bit<32> round; bit<32> pending; }
struct missing_t { bit<32> round; bit<32> missing; }

parser HoldParser(packet_in p, out hdr_t hdr, out md_t m, out ingress_intrinsic_metadata_t ig) {
    state start {
        p.extract(ig);
        p.advance(PORT_METADATA_SIZE);
        p.extract(hdr.eth);
        p.extract(hdr.h);
        transition accept;
    }
}

control Hold(inout hdr_t hdr, inout md_t m, in ingress_intrinsic_metadata_t ig,
             in ingress_intrinsic_metadata_from_parser_t prsr,
             inout ingress_intrinsic_metadata_for_deparser_t dprsr,
             inout ingress_intrinsic_metadata_for_tm_t tm) {
#if VARIANT == 1
    Register<heard_t, bit<8>>(256) head;
    RegisterAction<heard_t, bit<8>, bit<8>>(head) hold = {
        void apply(inout heard_t v, out bit<8> held) {
            held = 0;
            if (v.round == hdr.h.round) {                               // the head round
                v.heard = v.heard | m.rank_bit;
            } else if ((int<32>)(hdr.h.round - v.round) > 0) {          // a newer round
                if ((v.heard & m.others) == m.others) {                 // all others heard
                    v.round = hdr.h.round;
                    v.heard = m.rank_bit;
                } else {
                    v.heard = v.heard | m.rank_bit;
                    held = 1;
                }
            }
        }
    };
#elif VARIANT == 3
    Register<pending_t, bit<8>>(256) head;
    RegisterAction<pending_t, bit<8>, bit<8>>(head) hold = {
        void apply(inout pending_t v, out bit<8> held) {
            held = 0;
            if (v.round == hdr.h.round) {                               // the head round
                v.pending = v.pending & m.others;
            } else if ((int<32>)(hdr.h.round - v.round) > 0) {          // a newer round
                if (v.pending == 0 || v.pending == m.rank_bit) {        // none, or the sender
                    v.round = hdr.h.round;
                    v.pending = m.others;
                } else {
                    v.pending = v.pending & m.others;
                    held = 1;
                }
            }
        }
    };
#elif VARIANT == 4
    Register<pending_t, bit<8>>(256) head;
    RegisterAction<pending_t, bit<8>, bit<8>>(head) hold = {
        void apply(inout pending_t v, out bit<8> held) {
            held = 0;
            if (v.round == hdr.h.round) {                               // the head round
                v.pending = v.pending & ~m.rank_bit;
            } else if ((int<32>)(hdr.h.round - v.round) > 0) {          // a newer round
                if (v.pending == 0 || v.pending == m.rank_bit) {        // none, or the sender
                    v.round = hdr.h.round;
                    v.pending = ~m.rank_bit;
                } else {
                    v.pending = v.pending & ~m.rank_bit;
                    held = 1;
                }
            }
        }
    };
#else
    Register<missing_t, bit<8>>(256) head;
    RegisterAction<missing_t, bit<8>, bit<8>>(head) hold = {
        void apply(inout missing_t v, out bit<8> held) {
            held = 0;
            if (v.round == hdr.h.round) {                               // the head round
                v.missing = v.missing - m.unheard;
            } else if ((int<32>)(hdr.h.round - v.round) > 0) {          // a newer round
                if (v.missing <= m.unheard) {                           // none, or the sender
                    v.round = hdr.h.round;
                    v.missing = m.nworkers_1;
                } else {
                    v.missing = v.missing - m.unheard;
                    held = 1;
                }
            }
        }
    };
#endif
    apply {
        m.rank_bit = hdr.h.rank_bit;  // the program's rank_to_bit table, here a field
        m.others = (bit<32>)hdr.h.others;
        m.unheard = (bit<32>)hdr.h.others[0:0];
        m.nworkers_1 = (bit<32>)hdr.h.nworkers;
        m.held = hold.execute(hdr.h.rank);
        if (m.held == 1) {
            dprsr.drop_ctl = 1;
        }
        tm.ucast_egress_port = ig.ingress_port;
    }
}

control HoldDeparser(packet_out p, inout hdr_t hdr, in md_t m,
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

Pipeline(HoldParser(), Hold(), HoldDeparser(), NoParser(), NoEgress(), NoDeparser()) pipe;
Switch(pipe) main;
