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

// int32 elements per block, and where each is added. A Tofino 1 stateful ALU updates a pair of
// 32-bit halves at once but returns one word per pass, so the elements live in pair registers
// (slot_values_l0_p<P>: element 2P in the low half, 2P + 1 in the high half). Ingress's chain
// ends in `decide` (stage 5: admission 0, gate 1, slot range 2, slot_round and slot_rank_round
// 3, slot_count and slot_length 4); stages 6-11 hold slot_bitmap, slot_present,
// slot_nonfinite, slot_flags, slot_exponent, slot_next_l0 and the INGRESS_PAIRS ingress pairs
// (header block_i): 23 of their 24 stateful ALUs. EGRESS_PAIRS pairs (elements 0 ..
// 2 * EGRESS_PAIRS - 1, header block_e) are added in egress, in the stateful ALUs of stages
// 0-5 that ingress leaves free, keyed on the op ingress bridges. Tofino 1's egress parser
// reaches 160 bytes, 27 of them intrinsic metadata: ingress emits block_e right behind the
// 8-byte bridged header, 27 + 8 + 8 * 15 = 155, so 15 egress pairs at most. Every aggregated
// packet crosses egress through the recirculation port (a held one is dropped there); a reply
// goes round twice more (the high halves, then back to wire order: include/parser.p4,
// aggregator.p4).
// As compiled by bf-p4c 1.2.5.16 (tofino/build/resources.md): 15 + 17 pairs = 64 elements fit
// 12 stages once the tables after decide form one flat sequence and the egress pairs a branch
// of their own (aggregator.p4, include/pipe.p4: on Tofino 1 bf-p4c places no more of a sequence
// while a branch nested in it is being placed; tofino/README.md, "Toward 64"). The lists
// below also hold 46 (15 + 8) and 54 (15 + 12) elements.
// The egress pairs' stages, asked of bf-p4c (it places ingress and egress tables together
// and would otherwise give ingress's stages 6-11 to egress pairs): 4 + 4 + 2 + 2 + 2 + 1,
// beside job_loss_credit (egress), slot_round and slot_rank_round (3), slot_count and
// slot_length (4). It does not always follow them (tofino/build/resources.md has where
// they went).
#define SPINA_EGRESS_PAIR_STAGE_0 0
#define SPINA_EGRESS_PAIR_STAGE_1 0
#define SPINA_EGRESS_PAIR_STAGE_2 0
#define SPINA_EGRESS_PAIR_STAGE_3 0
#define SPINA_EGRESS_PAIR_STAGE_4 1
#define SPINA_EGRESS_PAIR_STAGE_5 1
#define SPINA_EGRESS_PAIR_STAGE_6 1
#define SPINA_EGRESS_PAIR_STAGE_7 1
#define SPINA_EGRESS_PAIR_STAGE_8 2
#define SPINA_EGRESS_PAIR_STAGE_9 2
#define SPINA_EGRESS_PAIR_STAGE_10 3
#define SPINA_EGRESS_PAIR_STAGE_11 3
#define SPINA_EGRESS_PAIR_STAGE_12 4
#define SPINA_EGRESS_PAIR_STAGE_13 4
#define SPINA_EGRESS_PAIR_STAGE_14 5
// BLOCK_SIZE and INGRESS_PAIRS may be given when compiling (-DBLOCK_SIZE=46 -DINGRESS_PAIRS=8,
// or 54 and 12: the lists below) to measure a smaller block; the program is 64.
#ifndef BLOCK_SIZE
#define BLOCK_SIZE 64
#endif
// The lane width: a compile-time profile (-DSPINA_LANE_BITS=16 or 8; default 32, int32 lanes).
// One program serves one width: its parser holds one size, and a packet whose width flags
// (FLAG_LANES16, FLAG_LANES8) are not the program's is malformed. A narrow program keeps the
// 64 values per packet in fewer bytes (128 or 64) and sums them in pair registers of two
// lane-wide halves with the stateful ALU's saturating add (tofino/README.md, "Narrow lanes").
#ifndef SPINA_LANE_BITS
#define SPINA_LANE_BITS 32
#endif
#if SPINA_LANE_BITS == 32
#define LANE_FLAG 0x00
#define BLOCK_BYTES 256
#elif SPINA_LANE_BITS == 16
#define LANE_FLAG 0x40
#define BLOCK_BYTES 128
#elif SPINA_LANE_BITS == 8
#define LANE_FLAG 0x80
#define BLOCK_BYTES 64
#else
#error "SPINA_LANE_BITS must be 32, 16 or 8"
#endif
#define PAIRS 32
#define EGRESS_PAIRS 15
#ifndef INGRESS_PAIRS
#define INGRESS_PAIRS 17
#endif

// Blocks per packet: one (one next position, one present bit).
#define NLANES 1

// The recirculation port of each pipe (Tofino 1: local port 68; the pipe is port[8:7]). A
// packet arriving there carries a harvest header in front of its Ethernet header. The Tofino 2
// profile (spina_t2na_roles.p4) defines its own before this file.
#ifndef RECIRC_PORT
#define RECIRC_PORT 68
#endif
#define RECIRC_PORT_MASK 0x7f

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
// M(L, BLOCK_SIZE - 1) (p4src/shared/header.p4's block types); FOR_EACH_LANE(M) expands M(0).
// FOR_EACH_EGRESS_ELEM / FOR_EACH_INGRESS_ELEM list the elements of block_e / block_i;
// FOR_EACH_EGRESS_PAIR / FOR_EACH_INGRESS_PAIR expand M(P, 2P, 2P + 1) per pair register.
#if EGRESS_PAIRS != 15
#error "EGRESS_PAIRS must be 15 (extend the lists below)"
#endif
#if INGRESS_PAIRS == 8 && BLOCK_SIZE == 46
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
        M(L, 8) M(L, 9) M(L, 10) M(L, 11) M(L, 12) M(L, 13) M(L, 14) M(L, 15) M(L, 16) M(L, \
        17) M(L, 18) M(L, 19) M(L, 20) M(L, 21) M(L, 22) M(L, 23) M(L, 24) M(L, 25) M(L, 26) \
        M(L, 27) M(L, 28) M(L, 29) M(L, 30) M(L, 31) M(L, 32) M(L, 33) M(L, 34) M(L, 35) \
        M(L, 36) M(L, 37) M(L, 38) M(L, 39) M(L, 40) M(L, 41) M(L, 42) M(L, 43) M(L, 44) \
        M(L, 45)
#define FOR_EACH_EGRESS_ELEM(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) \
        M(11) M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) \
        M(25) M(26) M(27) M(28) M(29)
#define FOR_EACH_INGRESS_ELEM(M) M(30) M(31) M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
        M(40) M(41) M(42) M(43) M(44) M(45)
#define FOR_EACH_EGRESS_PAIR(M) M(0,0,1) M(1,2,3) M(2,4,5) M(3,6,7) M(4,8,9) M(5,10,11) \
        M(6,12,13) M(7,14,15) M(8,16,17) M(9,18,19) M(10,20,21) M(11,22,23) M(12,24,25) \
        M(13,26,27) M(14,28,29)
#define FOR_EACH_INGRESS_PAIR(M) M(15,30,31) M(16,32,33) M(17,34,35) M(18,36,37) M(19,38,39) \
        M(20,40,41) M(21,42,43) M(22,44,45)
#elif INGRESS_PAIRS == 12 && BLOCK_SIZE == 54
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
        M(L, 8) M(L, 9) M(L, 10) M(L, 11) M(L, 12) M(L, 13) M(L, 14) M(L, 15) M(L, 16) M(L, \
        17) M(L, 18) M(L, 19) M(L, 20) M(L, 21) M(L, 22) M(L, 23) M(L, 24) M(L, 25) M(L, 26) \
        M(L, 27) M(L, 28) M(L, 29) M(L, 30) M(L, 31) M(L, 32) M(L, 33) M(L, 34) M(L, 35) \
        M(L, 36) M(L, 37) M(L, 38) M(L, 39) M(L, 40) M(L, 41) M(L, 42) M(L, 43) M(L, 44) \
        M(L, 45) M(L, 46) M(L, 47) M(L, 48) M(L, 49) M(L, 50) M(L, 51) M(L, 52) M(L, 53)
#define FOR_EACH_EGRESS_ELEM(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) \
        M(11) M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) \
        M(25) M(26) M(27) M(28) M(29)
#define FOR_EACH_INGRESS_ELEM(M) M(30) M(31) M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
        M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47) M(48) M(49) M(50) M(51) M(52) M(53)
#define FOR_EACH_EGRESS_PAIR(M) M(0,0,1) M(1,2,3) M(2,4,5) M(3,6,7) M(4,8,9) M(5,10,11) \
        M(6,12,13) M(7,14,15) M(8,16,17) M(9,18,19) M(10,20,21) M(11,22,23) M(12,24,25) \
        M(13,26,27) M(14,28,29)
#define FOR_EACH_INGRESS_PAIR(M) M(15,30,31) M(16,32,33) M(17,34,35) M(18,36,37) M(19,38,39) \
        M(20,40,41) M(21,42,43) M(22,44,45) M(23,46,47) M(24,48,49) M(25,50,51) M(26,52,53)
#elif INGRESS_PAIRS == 17 && BLOCK_SIZE == 64
#define FOR_EACH_ELEM(M, L) M(L, 0) M(L, 1) M(L, 2) M(L, 3) M(L, 4) M(L, 5) M(L, 6) M(L, 7) \
        M(L, 8) M(L, 9) M(L, 10) M(L, 11) M(L, 12) M(L, 13) M(L, 14) M(L, 15) M(L, 16) M(L, \
        17) M(L, 18) M(L, 19) M(L, 20) M(L, 21) M(L, 22) M(L, 23) M(L, 24) M(L, 25) M(L, 26) \
        M(L, 27) M(L, 28) M(L, 29) M(L, 30) M(L, 31) M(L, 32) M(L, 33) M(L, 34) M(L, 35) \
        M(L, 36) M(L, 37) M(L, 38) M(L, 39) M(L, 40) M(L, 41) M(L, 42) M(L, 43) M(L, 44) \
        M(L, 45) M(L, 46) M(L, 47) M(L, 48) M(L, 49) M(L, 50) M(L, 51) M(L, 52) M(L, 53) \
        M(L, 54) M(L, 55) M(L, 56) M(L, 57) M(L, 58) M(L, 59) M(L, 60) M(L, 61) M(L, 62) \
        M(L, 63)
#define FOR_EACH_EGRESS_ELEM(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) \
        M(11) M(12) M(13) M(14) M(15) M(16) M(17) M(18) M(19) M(20) M(21) M(22) M(23) M(24) \
        M(25) M(26) M(27) M(28) M(29)
#define FOR_EACH_INGRESS_ELEM(M) M(30) M(31) M(32) M(33) M(34) M(35) M(36) M(37) M(38) M(39) \
        M(40) M(41) M(42) M(43) M(44) M(45) M(46) M(47) M(48) M(49) M(50) M(51) M(52) M(53) \
        M(54) M(55) M(56) M(57) M(58) M(59) M(60) M(61) M(62) M(63)
#define FOR_EACH_EGRESS_PAIR(M) M(0,0,1) M(1,2,3) M(2,4,5) M(3,6,7) M(4,8,9) M(5,10,11) \
        M(6,12,13) M(7,14,15) M(8,16,17) M(9,18,19) M(10,20,21) M(11,22,23) M(12,24,25) \
        M(13,26,27) M(14,28,29)
#define FOR_EACH_INGRESS_PAIR(M) M(15,30,31) M(16,32,33) M(17,34,35) M(18,36,37) M(19,38,39) \
        M(20,40,41) M(21,42,43) M(22,44,45) M(23,46,47) M(24,48,49) M(25,50,51) M(26,52,53) \
        M(27,54,55) M(28,56,57) M(29,58,59) M(30,60,61) M(31,62,63)
#else
#error "BLOCK_SIZE = 2 * (EGRESS_PAIRS + INGRESS_PAIRS) with 12 or 17 ingress pairs"
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
