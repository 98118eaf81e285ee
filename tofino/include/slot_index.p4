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

#ifdef SPINA_TNA_ROLES
    @hidden action set_all_ranks(bit<32> mask) {
        meta.fab.all_ranks = mask;
    }
#define SPINA_ALL_RANKS_ENTRY(R) (R + 1): set_all_ranks((bit<32>)((33w1 << (R + 1)) - 1));
    @hidden table all_ranks {
        key = { meta.adm.nworkers: exact; }
        actions = { set_all_ranks; @defaultonly NoAction; }
        const entries = {
            FOR_EACH_RANK(SPINA_ALL_RANKS_ENTRY)
        }
        const default_action = NoAction();
        size = MAX_WORKERS;
    }

    // A spine adopting a leaf's REPLAY: the copy, fresh or incomplete, is raised to nworkers
    // by count_duplicate (a spine's count never exceeds nworkers; count_first cannot take
    // nworkers as a third input: experiments/roles.p4 -DVARIANT=5), and slot_bitmap is set
    // to the replay's ranks (every rack for a whole result, the replaying rack for a PARTIAL
    // one that names ranks, none otherwise). A leaf storing its spine's result sets no bit of
    // its own. One lookup: `if`s here delayed slot_round by three stages (tofino/README.md).
    @hidden action bitmap_rank_bit() {
        meta.fab.bitmap_in = meta.rank_bit;
    }
    @hidden action bitmap_all_ranks() {
        meta.fab.bitmap_in = meta.fab.all_ranks;
        meta.count_limit = meta.nworkers;
    }
    @hidden action bitmap_replaying_rack() {
        meta.fab.bitmap_in = meta.rank_bit;
        meta.count_limit = meta.nworkers;
    }
    @hidden action bitmap_none() {
        meta.fab.bitmap_in = 0;
    }
    @hidden action bitmap_none_limit() {
        meta.fab.bitmap_in = 0;
        meta.count_limit = meta.nworkers;
    }
    @hidden table role_inputs {
        key = {
            meta.fab.replay:      ternary;
            meta.fab.from_spine:  ternary;
            hdr.ina.flags:        ternary;
            hdr.ina.bitmap:       ternary;
        }
        actions = { bitmap_rank_bit; bitmap_all_ranks; bitmap_replaying_rack; bitmap_none;
                    bitmap_none_limit; @defaultonly NoAction; }
        const entries = {
            (true, _, 0 &&& FLAG_PARTIAL, _): bitmap_all_ranks();
            (true, _, _, 0): bitmap_none_limit();
            (true, _, _, _): bitmap_replaying_rack();
            (_, true, _, _): bitmap_none();
        }
        const default_action = NoAction();
        size = 4;
    }
#endif

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
        // count_duplicate's limit: nworkers when the packet asks for a flush.
        meta.count_limit = 0;
        if ((hdr.ina.flags & FLAG_PARTIAL) != 0) {
            meta.count_limit = meta.nworkers;
        }
#ifdef SPINA_TNA_ROLES
        meta.fab.all_ranks = 0;
        all_ranks.apply();
        meta.fab.bitmap_in = meta.rank_bit;
        role_inputs.apply();
#endif
    }
}

#endif
