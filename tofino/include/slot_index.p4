/* SpINA on Tofino 1: the slot registers' indexes and inputs (SlotIndex), from header fields
 * and admission only, applied before any branch so that they are ready when slot_round's
 * stage comes (aggregator.p4 says the order of the slot registers). The index types are the
 * registers' (SLOT_COPIES, RANK_CELLS, MAX_JOBS in size.p4).
 */
#ifndef SPINA_TNA_SLOT_INDEX_P4
#define SPINA_TNA_SLOT_INDEX_P4

typedef bit<9> copy_index_t;    // SLOT_COPIES = 512
typedef bit<14> rank_index_t;   // RANK_CELLS = 16384
typedef bit<11> job_index_t;    // MAX_JOBS = 2048

// The register indexes and inputs that depend on header fields (and admission) only, applied
// before any branch so that they are ready when slot_round's stage comes.
control SlotIndex(inout tna_headers_t hdr, inout tna_ingress_md_t meta) {
    Hash<copy_index_t>(HashAlgorithm_t.IDENTITY) copy_index;
    Hash<copy_index_t>(HashAlgorithm_t.IDENTITY) copy_index_bridged;
    @hidden action set_rank_bit(bit<32> bit_of_rank) {
        meta.rank_bit = bit_of_rank;
    }
#define SPINA_RANK_ENTRY(R) R: set_rank_bit(32w1 << R);
    @hidden table rank_to_bit {
        key = { hdr.ina.rank: exact; }
        actions = { set_rank_bit; @defaultonly NoAction; }
        const entries = {
            FOR_EACH_RANK(SPINA_RANK_ENTRY)
        }
        const default_action = NoAction();
        size = MAX_WORKERS;
    }

    SPINA_ROLE_SLOT_INDEX  // roles' profile: all_ranks, role_inputs
    SPINA_HOLD_SLOT_INDEX  // the hold: hold_last_rank


    apply {
        // The copy index slot * 2 + (round & 1) through an identity hash: one source for the
        // bridged copy egress indexes by (a concatenation in an action has two, and the
        // bridged header's byte beside it would be a third).
        meta.idx = copy_index.get({hdr.ina.slot[7:0], hdr.ina.round[0:0]});
        hdr.bridge.idx = copy_index_bridged.get({hdr.ina.slot[7:0], hdr.ina.round[0:0]});
        meta.rank_idx = hdr.ina.slot[7:0] ++ hdr.ina.round[0:0] ++ hdr.ina.rank[4:0];
        meta.round_next = hdr.ina.round + 1;
        meta.loss_tolerant = hdr.ina.flags & FLAG_LOSS_TOLERANT;
        meta.rank_bit = 0;
        rank_to_bit.apply();
        SPINA_HOLD_SLOT_INDEX_APPLY  // the hold: the sender's mask
        // count_duplicate's limit: nworkers when the packet asks for a flush.
        meta.count_limit = 0;
        if ((hdr.ina.flags & FLAG_PARTIAL) != 0) {
            meta.count_limit = meta.nworkers;
        }
        SPINA_ROLE_SLOT_INDEX_APPLY  // roles' profile: slot_bitmap's input
    }
}

#endif
