/* SpINA: every size of the P4 program, with the reason for it.
 *
 * The software switch accepts larger blocks and more fusion (it is not bound by a stage's
 * register budget nor by the MTU); spina/spec.py P4_SIZES repeats these numbers and
 * tests/test_p4_agreement.py checks that they agree.
 */
#ifndef SPINA_SIZE_P4
#define SPINA_SIZE_P4

// Slots in the shared pool. Each slot has two shadow copies (round & 1), so every slot
// register has 2 * POOL_SLOTS cells. 256 slots x 2 copies x 32 bits = 2 KiB per register
// array, far below a Tofino stage's SRAM; a job's window is its share of the pool.
#define POOL_SLOTS 256
#define SLOT_COPIES 512

// int32 elements per block. One register array per element and lane (a stateful ALU
// updates one register array once per packet), so BLOCK_SIZE * NLANES = 128 arrays. SwitchML
// aggregates 64 elements per pipeline pass on Tofino; 32 x 4 lanes keeps a full packet at
// 14 + 20 + 8 + 48 + 4*4 + 4*32*4 = 618 bytes, well inside a 1500-byte MTU (no jumbo frames
// needed on veth, mininet or a data-centre fabric).
#define BLOCK_SIZE 32
#define BLOCK_BYTES 128

// Blocks fused per packet: the parser unrolls this many lane positions and data blocks.
#define NLANES 4

// Ranks per job: slot_bitmap and the header's bitmap are 32 bits (32-bit switch ALUs).
#define MAX_WORKERS 32

// Counters indexed by job id (16 bits on the wire) and by port (9-bit v1model port).
#define MAX_JOBS 65536
#define MAX_PORTS 512

// Table sizes: a few jobs of at most 32 workers each, a small L2/L3 fabric.
#define ADMISSION_ENTRIES 1024
#define L2_ENTRIES 1024
#define IPV4_ENTRIES 1024
#define MAX_RIDS 4096
#define INA_ENDPOINT_ENTRIES 64

// Per-packet spraying (v1model forwarding.p4): a group id is 8 bits, so 256 groups, one
// spray_turn cell each; spray_ports holds every group's ports, one entry per turn.
#define SPRAY_GROUPS 256
#define SPRAY_PORT_ENTRIES 1024

// Repetition for generated per-lane and per-element declarations: one constant decides how
// many are generated; nothing is copied by hand. FOR_EACH_ELEM(M, L) expands M(L, 0) ...
// M(L, BLOCK_SIZE - 1); FOR_EACH_LANE(M) expands M(0) ... M(NLANES - 1).
#define SPINA_REP10(M, L, p) M(L, p##0) M(L, p##1) M(L, p##2) M(L, p##3) M(L, p##4) \
                             M(L, p##5) M(L, p##6) M(L, p##7) M(L, p##8) M(L, p##9)
#if BLOCK_SIZE == 32
#define FOR_EACH_ELEM(M, L) SPINA_REP10(M, L, ) SPINA_REP10(M, L, 1) SPINA_REP10(M, L, 2) \
                            M(L, 30) M(L, 31)
#elif BLOCK_SIZE == 64
#define FOR_EACH_ELEM(M, L) SPINA_REP10(M, L, ) SPINA_REP10(M, L, 1) SPINA_REP10(M, L, 2) \
                            SPINA_REP10(M, L, 3) SPINA_REP10(M, L, 4) SPINA_REP10(M, L, 5) \
                            M(L, 60) M(L, 61) M(L, 62) M(L, 63)
#else
#error "BLOCK_SIZE must be 32 or 64 (extend FOR_EACH_ELEM)"
#endif

#if NLANES == 4
#define FOR_EACH_LANE(M) M(0) M(1) M(2) M(3)
// Lane and its successor, for parser states that chain lane to lane.
#define FOR_EACH_LANE_PAIR(M) M(0, 1) M(1, 2) M(2, 3) M(3, 4)
#else
#error "NLANES must be 4 (extend FOR_EACH_LANE and FOR_EACH_LANE_PAIR)"
#endif

#endif
