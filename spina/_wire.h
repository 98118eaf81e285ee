/* The INA header as the C parts read and write it (host_agent/_core*.c, softswitch/_datapath.c):
 * spina/wire.py is the definition; these are copied from it by hand, and tests/test_core.py and
 * tests/test_datapath.py check them against wire.FIELD_OFFSET and the constants there. Below
 * them the one set of big-endian loads and stores every C part reads and writes the wire with. */
#ifndef SPINA_WIRE_H
#define SPINA_WIRE_H
#include <stdint.h>
#include <string.h>

#define HEADER_LEN 48
#define MAX_LANES 64
#define MAX_WORKERS 32
#define END_POS 0xFFFFFFFFu
/* byte offsets of the header fields */
#define OFF_VERSION 0
#define OFF_MSG_TYPE 1
#define OFF_FLAGS 2
#define OFF_PRIORITY 3
#define OFF_JOB 4
#define OFF_EPOCH 6
#define OFF_CALL 8
#define OFF_SLOT 12
#define OFF_RANK 14
#define OFF_NLANES 15
#define OFF_ROUND 16
#define OFF_LENGTH 20
#define OFF_BLOCK_SIZE 24
#define OFF_EXPONENT 26
#define OFF_BITMAP 28
#define OFF_PRESENT 32
#define OFF_NONFINITE 40
/* version, message types, flags */
#define WIRE_VERSION 1
#define MSG_CONTRIB 1
#define MSG_RESULT 2
#define MSG_STATUS 3
#define MSG_GATHER 4
#define FLAG_RESEND 0x01
#define FLAG_LOSS_TOLERANT 0x02
#define FLAG_LAST 0x04
#define FLAG_PARTIAL 0x08
#define FLAG_MISMATCH 0x10
/* narrow lanes (docs/bits.md): the data rows' width; both set is malformed */
#define FLAG_LANES16 0x40
#define FLAG_LANES8 0x80
#define FLAGS_LANE_WIDTH (FLAG_LANES16 | FLAG_LANES8)
/* bytes per data value of a packet with these flags (0: both widths set, malformed) */
#define LANE_ITEM_BYTES(flags) \
    (((flags) & FLAGS_LANE_WIDTH) == 0 ? 4 : ((flags) & FLAGS_LANE_WIDTH) == FLAG_LANES16 ? 2 \
     : ((flags) & FLAGS_LANE_WIDTH) == FLAG_LANES8 ? 1 : 0)

/* byte order: the wire is big-endian */
static inline void store_be32(unsigned char *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

static inline uint32_t load_be32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline void store_be16(unsigned char *p, uint16_t v) {
    v = __builtin_bswap16(v);
    memcpy(p, &v, 2);
}

static inline void store_be64(unsigned char *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

static inline uint64_t load_be64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}

static inline uint16_t load_be16(const unsigned char *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return __builtin_bswap16(v);
}

#endif
