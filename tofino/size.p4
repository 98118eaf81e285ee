/* SpINA on Tofino 1 (TNA): every size of tofino/spina_tna.p4, with the reason beside it.
 *
 * The limits (Tofino 1, one pipe): 12 match-action stages in ingress and 12 in egress, 4
 * stateful ALUs per stage (one RegisterAction per register per packet, cells of at most
 * 32 bits or a pair of 32-bit halves, a RegisterAction returns ONE 32-bit word), 4 large
 * constants per stateful ALU, no variable shifts, no 64-bit arithmetic, and a register read
 * reaches another register only one stage later. spina/spec.py TNA_SIZES repeats these
 * numbers; tests/test_tna_agreement.py checks that they agree.
 */
#ifndef SPINA_TNA_SIZE_P4
#define SPINA_TNA_SIZE_P4

// Slots and shadow copies as in p4src: 512 cells of 32 bits per slot register are 2 KiB,
// one SRAM block (16 KiB) holds a register array many times over.
#define POOL_SLOTS 256
#define SLOT_COPIES 512
// slot_rank_round: one cell per copy and rank (SLOT_COPIES * MAX_WORKERS = 16384, 64 KiB).
#define RANK_CELLS 16384

// int32 elements per block: one 32-bit register array per element. A pair register adds two
// elements but returns only one of them per pass (SwitchML harvests the other half by
// recirculating), and the completing packet must carry the whole sum in the same pass, so
// each element has a stateful ALU of its own. As bf-p4c 1.2.5.16 places the program
// (tofino/build/resources.md), the chain before the element registers ends in stage 5
// (admission 0, gate 1, slot range 2, slot_round and slot_rank_round 3, slot_count and
// slot_length 4, decide 5); stages 6, 7, 9, 10 and 11 hold 4 stateful ALUs each (stage 8
// holds the reply's header writes and none), and slot_bitmap, slot_present, slot_nonfinite,
// slot_exponent, slot_flags and slot_next_l0 take 6 of those 20: 14 elements fit. 16 need
// 13 stages (compiled: "tofino supports up to 12 stages, using 13").
#define BLOCK_SIZE 14
#define BLOCK_BYTES 56

// Blocks per packet: one. A second lane would need another 14 + 1 stateful ALUs in the same
// stages. No recirculation: a packet is aggregated in one ingress pass.
#define NLANES 1

// Ranks per job: slot_bitmap is 32 bits; rank -> bit is a const table (no variable shift).
#define MAX_WORKERS 32

// Counters indexed by job: admitted job ids are at most spec.MAX_JOB_ID (2046: a result's
// replication id job*32+rank+1 must fit 16 bits), so 2048 cells hold every job a counter
// can see (job counters count admitted packets, or results, or jobs with a congestion
// entry); the index is job[10:0]. 65536 cells per counter (p4src) would take 32 SRAM blocks
// each. Ports: Tofino 1 port ids are 9 bits.
#define MAX_JOBS 2048
#define MAX_PORTS 512

// Table sizes as in p4src.
#define ADMISSION_ENTRIES 1024
#define L2_ENTRIES 1024
#define IPV4_ENTRIES 1024
#define MAX_RIDS 4096
#define INA_ENDPOINT_ENTRIES 64

// Generated repetition (nothing is copied by hand): FOR_EACH_ELEM(M, L) expands M(L, 0) ..
// M(L, BLOCK_SIZE - 1); FOR_EACH_LANE(M) expands M(0) .. M(NLANES - 1).
// FOR_EACH_ELEM_GROUP(M) expands M(a, b, c, d) per four elements (one stage's stateful ALUs).
#if BLOCK_SIZE == 8
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7)
#define FOR_EACH_ELEM_GROUP(M) M(0, 1, 2, 3) M(4, 5, 6, 7)
#elif BLOCK_SIZE == 12
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
                            M(L, 8) M(L, 9) M(L, 10) M(L, 11)
#define FOR_EACH_ELEM_GROUP(M) M(0, 1, 2, 3) M(4, 5, 6, 7) M(8, 9, 10, 11)
#elif BLOCK_SIZE == 14
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
                            M(L, 8) M(L, 9) M(L, 10) M(L, 11) M(L, 12) M(L, 13)
#elif BLOCK_SIZE == 16
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
                            M(L, 8) M(L, 9) M(L, 10) M(L, 11) M(L, 12) M(L, 13) M(L, 14) \
                            M(L, 15)
#define FOR_EACH_ELEM_GROUP(M) M(0, 1, 2, 3) M(4, 5, 6, 7) M(8, 9, 10, 11) M(12, 13, 14, 15)
#else
#error "BLOCK_SIZE must be 8, 12, 14 or 16 on Tofino 1 (extend FOR_EACH_ELEM)"
#endif

#if NLANES == 1
#define FOR_EACH_LANE(M) M(0)
#else
#error "NLANES must be 1 on Tofino 1"
#endif

// FOR_EACH_RANK(M) expands M(0) ... M(MAX_WORKERS - 1): the rank -> bit const table.
#if MAX_WORKERS == 32
#define SPINA_TNA_REP10R(M, p) M(p##0) M(p##1) M(p##2) M(p##3) M(p##4) M(p##5) M(p##6) \
                               M(p##7) M(p##8) M(p##9)
#define FOR_EACH_RANK(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) \
                         SPINA_TNA_REP10R(M, 1) SPINA_TNA_REP10R(M, 2) M(30) M(31)
#else
#error "MAX_WORKERS must be 32 (extend FOR_EACH_RANK)"
#endif

#endif
