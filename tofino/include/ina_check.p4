/* SpINA on Tofino 1: is this INA packet well formed at the sizes this program aggregates?
 * Same test as p4src/v1model/ina_check.p4 (wire.check_header), at NLANES / BLOCK_SIZE only.
 * A packet with other sizes is malformed (port_malformed), where the software switch and
 * p4src find such a packet well formed and then unadmitted (port_unadmitted): the parser
 * holds one lane of BLOCK_SIZE elements, so the UDP length cannot be checked against other
 * sizes without a multiplier. Either way it is dropped and counted per ingress port. The
 * same for a lane width other than the program's (size.p4 SPINA_LANE_BITS, the width flags
 * FLAG_LANES16 / FLAG_LANES8 of wire.LANE_FLAGS): the software switch adds such a packet
 * and marks the round MISMATCH; one program holds one width.
 */
#ifndef SPINA_TNA_INA_CHECK_P4
#define SPINA_TNA_INA_CHECK_P4

// wire.check_header at this program's sizes, as one ternary lookup on header fields (stage 0):
// the two well-formed shapes (lane 0 absent or present) are entries, everything else is
// malformed. present/nonfinite bits beyond lane 0 must be 0, rank < 32, and the UDP length
// is header + one position (+ the block). The frame's own length needs no check: the parser
// extracted the whole datagram at these sizes, so a frame cut short sets parser_err.
control InaCheck(in tna_headers_t hdr, in bit<16> parser_err, inout tna_ingress_md_t meta) {
    @hidden action well_formed() {
        meta.malformed = false;
    }
    @hidden action mark_malformed() {
        meta.malformed = true;
    }
    @hidden table ina_check {
        key = {
            parser_err:          ternary;
            hdr.ina.isValid():   exact;
            hdr.ina.version:     ternary;
            hdr.ina.msg_type:    ternary;
            hdr.ina.nlanes:      ternary;
            hdr.ina.block_size:  ternary;
            hdr.ina.flags:       ternary;
            hdr.ina.rank:        ternary;
            hdr.ina.present:     ternary;
            hdr.ina.nonfinite:   ternary;
            hdr.udp.length:      ternary;
        }
        actions = { well_formed; @defaultonly mark_malformed; }
        const entries = {
            (0, true, INA_VERSION, MSG_CONTRIB, NLANES, BLOCK_SIZE, LANE_FLAG &&& FLAGS_LANE_WIDTH,
             0 &&& RANK_HIGH_BITS, 0,
             0 &&& LANE_HIGH_BITS, UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES): well_formed();
            (0, true, INA_VERSION, MSG_CONTRIB, NLANES, BLOCK_SIZE, LANE_FLAG &&& FLAGS_LANE_WIDTH,
             0 &&& RANK_HIGH_BITS, 1,
             0 &&& LANE_HIGH_BITS, UDP_HDR_BYTES + INA_HDR_BYTES + 4 * NLANES + BLOCK_BYTES):
                well_formed();
            SPINA_ROLE_WELL_FORMED  // roles' profile: the spine's RESULT and STATUS
        }
        const default_action = mark_malformed();
        size = INA_CHECK_ENTRIES;
    }

    apply {
        ina_check.apply();
    }
}

#endif
