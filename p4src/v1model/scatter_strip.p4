/* SpINA: the reduce-scatter's egress stage (docs/protocol.md "Reduce-scatter").
 *
 * A reduce-scatter contribution's bitmap names the ranks owning the blocks of its round;
 * SpinaIngress keeps the completing (or resent) contribution's in meta.owners before the
 * Aggregator writes the round's contributors there (0: an all-reduce, or a spine, whose
 * contributions are leaves' partials). A result copy for a rank outside `owners` keeps its
 * header and next positions: present and nonfinite 0, no block, its lengths to match. The
 * copy's rank: its rid's low five bits less one (spina.spec.rid: job * 32 + rank + 1), or for
 * the reply to a resend (rid 0) the header's rank, the resend's sender.
 * Results only (as softswitch/egress.py and tests/p4model.py): a status carries no block
 * (the Aggregator drops them all and clears present), and a leaf's partial going up is a
 * contribution, whose rank field is its rack's, not an owner's.
 * Before WorkerRewrite, whose truncate takes the UDP length set here.
 */
#ifndef SPINA_SCATTER_STRIP_P4
#define SPINA_SCATTER_STRIP_P4

control ScatterStrip(inout headers_t hdr, in metadata_t meta, in standard_metadata_t std) {
    apply {
        if (meta.ina_emitted && meta.owners != 0 && hdr.ina.msg_type == MSG_RESULT) {
            bit<5> rank = (bit<5>)hdr.ina.rank;
            if (std.egress_rid != 0) {
                rank = (bit<5>)(std.egress_rid - 1);
            }
            if (((meta.owners >> rank) & 1) == 0) {
                FOR_EACH_LANE(SPINA_DROP_BLOCK)
                hdr.ina.present = 0;
                hdr.ina.nonfinite = 0;
                hdr.udp.length = UDP_HDR_BYTES + INA_HDR_BYTES + 4 * (bit<16>)hdr.ina.nlanes;
                hdr.ipv4.total_len = IPV4_HDR_BYTES + hdr.udp.length;
            }
        }
    }
}

#endif
