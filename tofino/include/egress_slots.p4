/* SpINA on Tofino 1: the egress pairs (EgressSlots), the slot copy's elements of block_e
 * (include/pairs.p4), with the op ingress bridged (aggregator.p4).
 */
#ifndef SPINA_TNA_EGRESS_SLOTS_P4
#define SPINA_TNA_EGRESS_SLOTS_P4

// Egress: the egress pairs (block_e), with the op ingress bridged, in a pass through the
// recirculation port: a first pass adds (or reads the low halves), a reply's second pass
// reads the high halves.
control EgressSlots(inout tna_headers_t hdr) {
#define SPINA_EGRESS_PAIR(P, LO, HI) \
    SPINA_PAIR(P, LO, HI, hdr.block_e, hdr.bridge.value_op, hdr.bridge.read_hi, hdr.bridge.idx, \
               @stage(SPINA_EGRESS_PAIR_STAGE_##P))
    FOR_EACH_EGRESS_PAIR(SPINA_EGRESS_PAIR)

    apply {
        // A READ of the low halves adds the zeros the egress parser wrote into block_e.
        FOR_EACH_EGRESS_PAIR(SPINA_APPLY_PAIR)
    }
}

#endif
