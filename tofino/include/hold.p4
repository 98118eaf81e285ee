/* SpINA on Tofino 2 (T2NA), the hold of a newer round (softswitch Pipeline._held,
 * p4src/v1model/aggregator.p4's head_* registers) as one RegisterAction: the hooks the shared
 * controls expand where the hold adds something (include/hold_none.p4 defines the same names,
 * empty, for the profiles without it). tofino/spina_t2na_roles.p4 includes it.
 *
 * p4src keeps the head round, the ranks heard at it and how many are missing in three
 * registers; a stateful ALU reads and writes one cell in one step, and its decision needs
 * all three (tofino/README.md, "The hold and the roles on Tofino 1"). Here one cell per slot
 * holds the head round and `pending`, the ranks not yet heard at it, in the hold's own rank
 * masks: a job's ranks share the 32 bits between them (rank r < nworkers - 1 owns bit r, the
 * last rank every bit from nworkers - 1 up), so the others' ranks are ~mask, a constant-free
 * input, and "every other rank heard" is `pending` being 0 or the sender's mask: four
 * comparisons (Tofino 2 has four comparison units, Tofino 1 two) on two PHV inputs (round
 * and mask; experiments/hold.p4 -DVARIANT=4). A cleared cell (0) has nothing pending, as
 * p4src's head_missing = 0; pending's ranks are always missing's, so the decisions are p4src's
 * (tests/test_tna_model.py checks this rule against the software switch's).
 */
#ifndef SPINA_TNA_HOLD_P4
#define SPINA_TNA_HOLD_P4

struct head_t {
    bit<32> round;    // head round: the newest round started on the slot
    bit<32> pending;  // its ranks not yet heard, in hold masks
}

// types.p4: tna_ingress_md_t's field of the hold.
#define SPINA_HOLD_INGRESS_MD                                                           \
    bit<32>     hold_mask;     /* the sender's hold mask (include/hold.p4) */

// slot_index.p4: the sender's mask, its rank bit unless it is the job's last rank.
#define SPINA_HOLD_LAST_ENTRY(R) (R, R + 1): set_hold_mask(~((32w1 << R) - 1));
#define SPINA_HOLD_SLOT_INDEX                                                           \
    @hidden action set_hold_mask(bit<32> mask) {                                        \
        meta.hold_mask = mask;                                                          \
    }                                                                                   \
    @hidden table hold_last_rank {                                                      \
        key = { hdr.ina.rank: exact; meta.adm.nworkers: exact; }                        \
        actions = { set_hold_mask; @defaultonly NoAction; }                             \
        const entries = {                                                               \
            FOR_EACH_RANK(SPINA_HOLD_LAST_ENTRY)                                        \
        }                                                                               \
        const default_action = NoAction();                                              \
        size = MAX_WORKERS;                                                             \
    }
#define SPINA_HOLD_SLOT_INDEX_APPLY                                                     \
        meta.hold_mask = meta.rank_bit;                                                 \
        hold_last_rank.apply();

// aggregator.p4: the head cell per slot, and job_held.
#define SPINA_HOLD_ACTIONS                                                                       \
    @name(".job_held") Counter<bit<32>, job_index_t>(MAX_JOBS, CounterType_t.PACKETS) job_held;  \
    @name(".head_round") Register<head_t, bit<8>>(POOL_SLOTS) head_round;                        \
    /* 1: a newer round that must wait for a rank that may still need the copy it would */      \
    /* take (the round before last); its sender is marked heard. */                             \
    RegisterAction<head_t, bit<8>, bit<8>>(head_round) hold = {                                  \
        void apply(inout head_t v, out bit<8> held) {                                            \
            held = 0;                                                                            \
            if (v.round == hdr.ina.round) {                         /* the head round */         \
                v.pending = v.pending & ~meta.hold_mask;                                         \
            } else if ((int<32>)(hdr.ina.round - v.round) > 0) {    /* a newer round */          \
                if (v.pending == 0 || v.pending == meta.hold_mask) {  /* none, or the sender */  \
                    v.round = hdr.ina.round;                                                     \
                    v.pending = ~meta.hold_mask;                                                 \
                } else {                                                                         \
                    v.pending = v.pending & ~meta.hold_mask;                                     \
                    held = 1;                                                                    \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    };
// Before slot_round, on every admitted packet of the job's epoch (p4src's order).
#define SPINA_HOLD_APPLY                                                                \
            if (hold.execute(hdr.ina.slot[7:0]) != 0) {                                 \
                job_held.count(job);                                                    \
                ig_dprsr_md.drop_ctl = 1;                                               \
                return;                                                                 \
            }

#endif
