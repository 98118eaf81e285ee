/* The software switch's UDP data path, compiled (issue 27, item 1).
 *
 * softswitch/pipeline.py is the reference: the readable twin of the P4 program. This file runs
 * the same per-packet state operations on the same numpy register and counter arrays (their
 * memory, held here), for the packets a flat job's workers send: a well-formed contribution from
 * an admitted (IPv4, UDP port) on a slot of its job. Everything else, a malformed or unadmitted
 * packet, a result or status, any packet of a leaf or spine job, is handed back to Python
 * unread ("punted"), in arrival order, and Python's pipeline processes it on the same registers:
 * the two paths are one switch. tests/test_datapath.py feeds both the same random packet
 * sequences and compares every packet out, every register and every counter.
 *
 * Per call of serve(): receive a batch of datagrams (one recvmmsg), run each through the
 * pipeline (header checks, admission by a hash of (address, port, job, rank), epoch, the hold of
 * a newer round, the slot copy's round, bitmap and count, the big-endian int32 adds with
 * wrap-around (narrow lanes' int16/int8 rows sign-extended into them, the answer in the
 * round's width, clipped; docs/bits.md), the min of `next`, the ORs, max and flags), build
 * each result in its own buffer and send every copy of every result of the batch with one
 * sendmmsg. The GIL is released
 * throughout; the caller holds the pipeline's lock, so the control plane never sees half a
 * packet and this code never sees half a table change.
 *
 * Layout of a datagram and the header: spina/wire.py (48 bytes, nlanes u32 `next`, present
 * rows of block_size int32, int16 or int8 by the width flag, all big-endian). Register layout:
 * softswitch/pipeline.py.
 */
#define _GNU_SOURCE
#include "../spina/_pybuf.h"       /* Python.h, Buf, get_buf, release */
#include "../spina/_wire.h"        /* HEADER_LEN, OFF_*, MSG_*, FLAG_*, load_be/store_be */
#include <arpa/inet.h>
#include <linux/filter.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_UDP_PAYLOAD 65507

/* What process_one decided (softswitch/fabric.py's TO_GROUP, TO_SENDER, TO_OTHERS). */
#define PUNT (-1)
#define TO_GROUP 1
#define TO_SENDER 2
#define TO_OTHERS 4  /* an all-gather packet: the job's workers but its sender */
/* serve()'s outcomes */
#define SERVE_IDLE 0    /* nothing more to read now */
#define SERVE_BUDGET 1  /* the packet budget is spent; more may wait */
#define SERVE_PUNT 2    /* a packet for Python's pipeline */

#define BATCH 32
#define RECV_SIZE (MAX_UDP_PAYLOAD + 1)

/* A counter add. The counters are per job and a job's slots may be served by several threads
 * (UdpSwitch(datapath_threads=N), each on its own slots): relaxed atomic adds keep every count;
 * the registers need none, as each slot belongs to one thread. */
#define BUMP(counter, n) __atomic_fetch_add(&(counter), (uint64_t)(n), __ATOMIC_RELAXED)

/* The three loops over a block's values, built for AVX2 and for any x86-64 (chosen at load). */
__attribute__((target_clones("avx2", "default")))
static void load_row32(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        dst[i] = (int32_t)__builtin_bswap32(v);
    }
}

__attribute__((target_clones("avx2", "default")))
static void add_row32(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {  /* wrap-around, as the switch's 32-bit adders */
        uint32_t v;
        memcpy(&v, src + 4 * i, 4);
        dst[i] = (int32_t)((uint32_t)dst[i] + __builtin_bswap32(v));
    }
}

__attribute__((target_clones("avx2", "default")))
static void store_row32(uint8_t *dst, const int32_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t v = __builtin_bswap32((uint32_t)src[i]);
        memcpy(dst + 4 * i, &v, 4);
    }
}

/* Narrow lanes (docs/bits.md): int16/int8 rows, sign-extended into the int32 registers. */
__attribute__((target_clones("avx2", "default")))
static void load_row16(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = (int16_t)(uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
}

__attribute__((target_clones("avx2", "default")))
static void add_row16(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v = (int16_t)(uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
        dst[i] = (int32_t)((uint32_t)dst[i] + (uint32_t)v);
    }
}

__attribute__((target_clones("avx2", "default")))
static void add_row8(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = (int32_t)((uint32_t)dst[i] + (uint32_t)(int32_t)(int8_t)src[i]);
}

static void load_row8(int32_t *dst, const uint8_t *src, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        dst[i] = (int8_t)src[i];
}

/* A row of `item` bytes a value into the int32 registers: written (a copy a round starts) or
 * added with wrap-around. */
static void load_row(int32_t *dst, const uint8_t *src, Py_ssize_t n, int item) {
    (item == 4 ? load_row32 : item == 2 ? load_row16 : load_row8)(dst, src, n);
}

static void add_row(int32_t *dst, const uint8_t *src, Py_ssize_t n, int item) {
    (item == 4 ? add_row32 : item == 2 ? add_row16 : add_row8)(dst, src, n);
}

/* The sums of a narrow round's row, clipped to the lane's range [lo, hi], as `item`-byte
 * big-endian values; whether any was clipped (the answer saturated). */
__attribute__((target_clones("avx2", "default")))
static int store_narrow(uint8_t *dst, const int32_t *src, Py_ssize_t n, int item) {
    int32_t hi = item == 2 ? INT16_MAX : INT8_MAX, lo = -hi - 1;
    int clipped = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t v = src[i];
        clipped |= v < lo || v > hi;
        v = v < lo ? lo : v > hi ? hi : v;
        if (item == 2) {
            dst[2 * i] = (uint8_t)((uint32_t)v >> 8);
            dst[2 * i + 1] = (uint8_t)v;
        } else {
            dst[i] = (uint8_t)v;
        }
    }
    return clipped;
}

/* One admission row of a flat job (table `admission`, port 0) with its job's destinations. */
typedef struct {
    uint32_t ip;  /* host byte order */
    uint16_t port, job;
    uint8_t rank, used;
    uint16_t epoch;
    uint32_t slot_base, nslots, nworkers, block_size, nlanes;
    uint32_t dest_first, dest_count;
} Entry;

typedef struct {
    PyObject_HEAD
    int fd;
    /* registers (softswitch/pipeline.py), counters indexed by job */
    Buf bufs[21];
    uint32_t *round, *bitmap, *count, *next, *length, *h_round, *h_heard;
    int32_t *values;
    uint64_t *present, *nonfinite;
    int16_t *exponent;
    uint8_t *flags, *h_missing;
    uint64_t *c_received, *c_stale, *c_held, *c_duplicates, *c_results, *c_aggregated;
    uint64_t *c_lane_saturated, *c_lane_mismatch;
    Py_ssize_t pool_slots, capacity, njobs;
    int hold;
    /* tables: open addressing, a power-of-two size */
    Entry *table;
    uint32_t table_mask;
    struct sockaddr_in *dests;
    uint8_t *dest_rank;  /* each destination's rank (NO_RANK: unknown, every copy whole) */
    uint32_t ndests;
    int scatter;         /* reduce-scatter rounds served here (UDP mode), else punted */
    uint8_t *hbuf;       /* per packet of a batch: its header-only copy (ScatterStrip) */
    /* receive batch */
    uint8_t *rbuf;
    struct mmsghdr rmsg[BATCH];
    struct iovec riov[BATCH];
    struct sockaddr_in raddr[BATCH];
    int rcount, rnext;
    /* send batch: one buffer per packet processed, as many copies as it has destinations */
    uint8_t *obuf;
    Py_ssize_t out_len;
    int oused;
    struct mmsghdr *smsg;
    struct iovec *siov;
    struct sockaddr_in *saddr;
    int scount;
    unsigned long long packets_in, bytes_in, packets_out, bytes_out, send_errors;
} Datapath;

static uint32_t hash_key(uint32_t ip, uint16_t port, uint16_t job, uint8_t rank) {
    uint64_t h = ((uint64_t)ip << 32 | (uint64_t)port << 16 | job) * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t)rank * 0xC2B2AE3D27D4EB4Full;
    return (uint32_t)(h >> 32) ^ (uint32_t)h;
}

static const Entry *lookup(const Datapath *d, uint32_t ip, uint16_t port, uint16_t job,
                           uint8_t rank) {
    if (!d->table)
        return NULL;
    for (uint32_t i = hash_key(ip, port, job, rank) & d->table_mask;; i = (i + 1) & d->table_mask) {
        const Entry *e = &d->table[i];
        if (!e->used)
            return NULL;
        if (e->ip == ip && e->port == port && e->job == job && e->rank == rank)
            return e;
    }
}

/* head_*: the hold of a newer round (Pipeline._held). 1: drop it, held. */
static int held(Datapath *d, uint32_t slot, uint32_t rnd, uint32_t bit, uint32_t nworkers) {
    uint32_t head = d->h_round[slot];
    uint8_t missing = d->h_missing[slot];
    int unheard = !(d->h_heard[slot] & bit);
    uint32_t delta = rnd - head;
    if (delta == 0 || delta >= 1u << 31) {
        if (delta == 0 && unheard && missing) {
            d->h_heard[slot] |= bit;
            d->h_missing[slot] = (uint8_t)(missing - 1);
        }
        return 0;
    }
    if (missing == 0 || (missing == 1 && unheard)) {
        d->h_round[slot] = rnd;
        d->h_heard[slot] = bit;
        d->h_missing[slot] = (uint8_t)(nworkers - 1);
        return 0;
    }
    if (unheard) {
        d->h_heard[slot] |= bit;
        d->h_missing[slot] = (uint8_t)(missing - 1);
    }
    return 1;
}

/* The result of the round stored at copy `idx`, in reply to the request `req` (Pipeline.
 * result_into); its length. A narrow round answers in its width, clipped to its range, the
 * packet counted once in job_lane_saturated if any sum was clipped. */
static Py_ssize_t result_into(const Datapath *d, uint8_t *out, const uint8_t *req, Py_ssize_t idx,
                              unsigned k, uint32_t bs, uint8_t extra) {
    memcpy(out, req, HEADER_LEN);  /* the request's identity; the rest is the slot's */
    out[OFF_MSG_TYPE] = MSG_RESULT;
    out[OFF_FLAGS] = (uint8_t)(d->flags[idx] | (req[OFF_FLAGS] & FLAG_LOSS_TOLERANT) | extra);
    store_be32(out + OFF_LENGTH, d->length[idx]);
    store_be16(out + OFF_EXPONENT, (uint16_t)d->exponent[idx]);
    store_be32(out + OFF_BITMAP, d->bitmap[idx]);
    uint64_t present = d->present[idx];
    store_be64(out + OFF_PRESENT, present);
    store_be64(out + OFF_NONFINITE, d->nonfinite[idx]);
    const uint32_t *nx = d->next + idx * MAX_LANES;
    for (unsigned i = 0; i < k; i++)
        store_be32(out + HEADER_LEN + 4 * i, nx[i]);
    uint8_t *dst = out + HEADER_LEN + 4 * k;
    const int32_t *vals = d->values + idx * d->capacity;
    int item = LANE_ITEM_BYTES(d->flags[idx]), clipped = 0;
    for (uint64_t p = present; p; p &= p - 1) {
        const int32_t *row = vals + (Py_ssize_t)__builtin_ctzll(p) * bs;
        if (item == 4)
            store_row32(dst, row, bs);
        else
            clipped |= store_narrow(dst, row, bs, item);
        dst += item * (Py_ssize_t)bs;
    }
    if (clipped)
        BUMP(d->c_lane_saturated[load_be16(req + OFF_JOB)], 1);
    return dst - out;
}

/* One datagram from (ip, port): the length of the packet written to `out` (0: none leaves,
 * *to says where it goes, *hit the admission row) or PUNT, with nothing read or written, when
 * Python's pipeline must process it. Pipeline.process_into's order and operations exactly. */
static Py_ssize_t process_one(Datapath *d, const uint8_t *pkt, Py_ssize_t size, uint32_t ip,
                              uint16_t sport, uint8_t *out, int *to, const Entry **hit) {
    if (size < HEADER_LEN || pkt[OFF_VERSION] != WIRE_VERSION)
        return PUNT;
    /* an all-gather packet: served in the UDP mode (the L2 mode's frames of it are Python's) */
    int gather = pkt[OFF_MSG_TYPE] == MSG_GATHER && d->scatter;
    if (pkt[OFF_MSG_TYPE] != MSG_CONTRIB && !gather)
        return PUNT;
    if (load_be32(pkt + OFF_BITMAP) && !d->scatter)
        return PUNT;  /* a reduce-scatter round: the L2 mode's replicas are Python's to strip */
    int item = LANE_ITEM_BYTES(pkt[OFF_FLAGS]);  /* bytes a value: 4, or narrow lanes' 2, 1 */
    if (!item)
        return PUNT;  /* both widths: malformed, Python counts it */
    unsigned k = pkt[OFF_NLANES], rank = pkt[OFF_RANK];
    uint32_t bs = load_be16(pkt + OFF_BLOCK_SIZE);
    uint64_t present = load_be64(pkt + OFF_PRESENT), nonfinite = load_be64(pkt + OFF_NONFINITE);
    if (k < 1 || k > MAX_LANES || bs == 0 || rank >= MAX_WORKERS)
        return PUNT;
    uint64_t full = k == 64 ? ~0ull : (1ull << k) - 1;
    if ((present & ~full) || (nonfinite & ~full))
        return PUNT;
    unsigned npresent = (unsigned)__builtin_popcountll(present);
    if ((uint64_t)size != HEADER_LEN + 4ull * k + (uint64_t)item * bs * npresent)
        return PUNT;
    uint16_t job = load_be16(pkt + OFF_JOB);
    uint32_t slot = load_be16(pkt + OFF_SLOT);
    const Entry *e = lookup(d, ip, sport, job, (uint8_t)rank);
    if (!e || slot < e->slot_base || slot >= e->slot_base + e->nslots || k != e->nlanes
        || bs != e->block_size)
        return PUNT;  /* Python counts it (port_unadmitted) and logs it */
    uint32_t rnd = load_be32(pkt + OFF_ROUND);
    Py_ssize_t idx = 2 * (Py_ssize_t)slot + (rnd & 1);
    *hit = e;
    BUMP(d->c_received[job], 1);
    if (load_be16(pkt + OFF_EPOCH) != e->epoch) {
        BUMP(d->c_stale[job], 1);
        return 0;
    }
    if (gather) {  /* Aggregator: it leaves as it came, no register read or written */
        memcpy(out, pkt, (size_t)size);
        *to = TO_OTHERS;
        return size;
    }
    uint8_t flags = pkt[OFF_FLAGS];
    uint32_t nworkers = e->nworkers, bit = 1u << rank;
    if (d->hold && held(d, slot, rnd, bit, nworkers)) {
        BUMP(d->c_held[job], 1);
        return 0;
    }
    int32_t delta = (int32_t)(rnd - d->round[idx]);  /* slot_round: newer resets, older is stale */
    if (delta < 0) {
        BUMP(d->c_stale[job], 1);
        return 0;
    }
    int fresh = delta > 0;
    uint32_t old_bitmap = 0, old_count = 0;
    if (fresh) {
        d->round[idx] = rnd;
    } else {
        old_bitmap = d->bitmap[idx];
        old_count = d->count[idx];
    }
    if (old_count >= nworkers) {  /* complete: the stored result back to the sender */
        BUMP(d->c_duplicates[job], 1);
        BUMP(d->c_results[job], 1);
        *to = TO_SENDER;
        return result_into(d, out, pkt, idx, k, bs, FLAG_RESEND);
    }
    if (old_bitmap & bit) {
        BUMP(d->c_duplicates[job], 1);
        if (flags & FLAG_PARTIAL) {  /* a flush (bounded loss): complete without the missing */
            d->count[idx] = nworkers;
            d->flags[idx] |= FLAG_PARTIAL;
            BUMP(d->c_results[job], nworkers);
            *to = TO_GROUP;
            return result_into(d, out, pkt, idx, k, bs, 0);
        }
        /* STATUS: the sender's header and next positions, with the round's bitmap */
        memcpy(out, pkt, HEADER_LEN + 4 * k);
        out[OFF_MSG_TYPE] = MSG_STATUS;
        out[OFF_FLAGS] = flags & (uint8_t)~(FLAG_LAST | FLAG_PARTIAL);
        store_be32(out + OFF_BITMAP, old_bitmap);
        store_be64(out + OFF_PRESENT, 0);
        store_be64(out + OFF_NONFINITE, 0);
        *to = TO_SENDER;
        return HEADER_LEN + 4 * k;
    }
    d->bitmap[idx] = old_bitmap | bit;
    uint32_t count = old_count + 1;
    d->count[idx] = count;

    int32_t *vals = d->values + idx * d->capacity;
    uint32_t *nx = d->next + idx * MAX_LANES;
    const uint8_t *pn = pkt + HEADER_LEN, *pd = pkt + HEADER_LEN + 4 * k;
    size_t row_bytes = (size_t)item * bs;
    int16_t exponent = (int16_t)load_be16(pkt + OFF_EXPONENT);
    uint32_t length = load_be32(pkt + OFF_LENGTH);
    if (fresh) {
        if (present == full) {
            load_row(vals, pd, (Py_ssize_t)k * bs, item);
        } else {
            memset(vals, 0, 4 * (size_t)k * bs);
            for (uint64_t p = present; p; p &= p - 1, pd += row_bytes)
                load_row(vals + (Py_ssize_t)__builtin_ctzll(p) * bs, pd, bs, item);
        }
        for (unsigned i = 0; i < k; i++)
            nx[i] = load_be32(pn + 4 * i);
        d->present[idx] = present;
        d->nonfinite[idx] = nonfinite;
        d->exponent[idx] = exponent;
        d->length[idx] = length;
        d->flags[idx] = flags & (FLAG_LAST | FLAGS_LANE_WIDTH);  /* the round's width: its first */
    } else {
        if (present == full) {
            add_row(vals, pd, (Py_ssize_t)k * bs, item);
        } else {
            for (uint64_t p = present; p; p &= p - 1, pd += row_bytes)
                add_row(vals + (Py_ssize_t)__builtin_ctzll(p) * bs, pd, bs, item);
        }
        for (unsigned i = 0; i < k; i++) {
            uint32_t v = load_be32(pn + 4 * i);
            if (v < nx[i])
                nx[i] = v;
        }
        d->present[idx] |= present;
        d->nonfinite[idx] |= nonfinite;
        if (exponent > d->exponent[idx])
            d->exponent[idx] = exponent;
        uint8_t old = d->flags[idx];
        uint8_t nf = (uint8_t)((old & ~FLAG_LAST) | (old & flags & FLAG_LAST));
        if (length != d->length[idx])
            nf |= FLAG_MISMATCH;
        if ((flags ^ old) & FLAGS_LANE_WIDTH) {  /* another width than the round's first */
            nf |= FLAG_MISMATCH;
            BUMP(d->c_lane_mismatch[job], 1);
        }
        d->flags[idx] = nf;
    }
    BUMP(d->c_aggregated[job], 1);
    if (count < nworkers)
        return 0;
    BUMP(d->c_results[job], nworkers);  /* P4 counts job_results per replica, in egress */
    *to = TO_GROUP;
    return result_into(d, out, pkt, idx, k, bs, 0);
}

/* ------------------------------------------------------------------ ScatterStrip */
/* A reduce-scatter (docs/protocol.md "Reduce-scatter"): the contribution's bitmap names the
 * ranks owning its round's blocks. A result's copy for any other rank is its header and next
 * positions only (softswitch/egress.py scatter_strip). */
#define NO_RANK 0xFF
#define HEAD_MAX (HEADER_LEN + 4 * MAX_LANES)

/* The owners of the result `out` made of contribution `pkt` (0: every copy whole). */
static inline uint32_t owners_of(const uint8_t *pkt, const uint8_t *out) {
    return out[OFF_MSG_TYPE] == MSG_RESULT ? load_be32(pkt + OFF_BITMAP) : 0;
}

static inline int owns(uint32_t owners, unsigned rank) {
    return !owners || rank >= MAX_WORKERS || (owners >> rank & 1);
}

static inline int same_address(const struct sockaddr_in *a, const struct sockaddr_in *b) {
    return a->sin_addr.s_addr == b->sin_addr.s_addr && a->sin_port == b->sin_port;
}

/* The header-only copy of result `out` into `dst` (may be `out`); its length. */
static Py_ssize_t strip_into(uint8_t *dst, const uint8_t *out) {
    Py_ssize_t n = HEADER_LEN + 4 * (Py_ssize_t)out[OFF_NLANES];
    if (dst != out)
        memcpy(dst, out, (size_t)n);
    store_be64(dst + OFF_PRESENT, 0);
    store_be64(dst + OFF_NONFINITE, 0);
    return n;
}

/* ------------------------------------------------------------------ sockets */
static void queue_send(Datapath *d, uint8_t *data, Py_ssize_t n, const struct sockaddr_in *to) {
    int i = d->scount++;
    d->saddr[i] = *to;
    d->siov[i].iov_base = data;
    d->siov[i].iov_len = (size_t)n;
    memset(&d->smsg[i].msg_hdr, 0, sizeof d->smsg[i].msg_hdr);
    d->smsg[i].msg_hdr.msg_name = &d->saddr[i];
    d->smsg[i].msg_hdr.msg_namelen = sizeof d->saddr[i];
    d->smsg[i].msg_hdr.msg_iov = &d->siov[i];
    d->smsg[i].msg_hdr.msg_iovlen = 1;
}

/* Send every queued copy: a full send buffer waits for room once (200 ms), as the Python
 * path does; a copy that still fails (or is refused) is skipped and counted. */
static void flush_sends(Datapath *d) {
    int off = 0, waited = 0;
    while (off < d->scount) {
        int m = sendmmsg(d->fd, d->smsg + off, (unsigned)(d->scount - off), 0);
        if (m > 0) {
            for (int i = off; i < off + m; i++)
                d->bytes_out += d->siov[i].iov_len;
            d->packets_out += (unsigned long long)m;
            off += m;
            waited = 0;
        } else if (m < 0 && errno == EINTR) {
            continue;
        } else if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !waited) {
            struct pollfd pfd = {.fd = d->fd, .events = POLLOUT};
            poll(&pfd, 1, 200);
            waited = 1;
        } else {
            d->send_errors++;
            off++;
            waited = 0;
        }
    }
    d->scount = 0;
    d->oused = 0;
}

static int serve_loop(Datapath *d, long budget, int *punt) {
    long done = 0;
    int errors = 0;
    for (;;) {
        if (d->rnext >= d->rcount) {
            flush_sends(d);
            if (done >= budget)
                return SERVE_BUDGET;
            for (int i = 0; i < BATCH; i++)
                d->rmsg[i].msg_hdr.msg_namelen = sizeof d->raddr[i];
            int n = recvmmsg(d->fd, d->rmsg, BATCH, MSG_DONTWAIT, NULL);
            if (n <= 0) {
                if (n < 0 && errno == EINTR)
                    continue;
                if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK || ++errors > 8)
                    return SERVE_IDLE;
                continue;  /* e.g. an ICMP error reported on the socket: never stop serving */
            }
            d->rcount = n;
            d->rnext = 0;
            d->packets_in += (unsigned long long)n;
            for (int i = 0; i < n; i++)
                d->bytes_in += d->rmsg[i].msg_len;
        }
        int i = d->rnext;
        const struct sockaddr_in *src = &d->raddr[i];
        uint8_t *out = d->obuf + (Py_ssize_t)d->oused * d->out_len;
        int to = 0;
        const Entry *e = NULL;
        Py_ssize_t n = src->sin_family == AF_INET ?
            process_one(d, d->rbuf + (Py_ssize_t)i * RECV_SIZE, d->rmsg[i].msg_len,
                        ntohl(src->sin_addr.s_addr), ntohs(src->sin_port), out, &to, &e) : PUNT;
        if (n == PUNT) {
            flush_sends(d);  /* what came before it leaves before Python answers it */
            *punt = i;
            d->rnext++;
            return SERVE_PUNT;
        }
        d->rnext++;
        done++;
        if (n > 0) {
            const uint8_t *pkt = d->rbuf + (Py_ssize_t)i * RECV_SIZE;
            uint32_t owners = owners_of(pkt, out);
            uint8_t *head = d->hbuf + (Py_ssize_t)d->oused * HEAD_MAX;
            Py_ssize_t hn = 0;
            d->oused++;
            if (to == TO_SENDER) {
                if (!owns(owners, pkt[OFF_RANK]))
                    n = strip_into(out, out);
                queue_send(d, out, n, src);
            } else {
                for (uint32_t j = 0; j < e->dest_count; j++) {
                    uint32_t x = e->dest_first + j;
                    if (to == TO_OTHERS && same_address(&d->dests[x], src))
                        continue;  /* an all-gather packet's sender has it */
                    if (owns(owners, d->dest_rank[x])) {
                        queue_send(d, out, n, &d->dests[x]);
                    } else {
                        if (!hn)
                            hn = strip_into(head, out);
                        queue_send(d, head, hn, &d->dests[x]);
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ Python type */
static const char *REGISTER_NAMES[] = {"slot_round", "slot_bitmap", "slot_count", "slot_values",
                                       "slot_next", "slot_present", "slot_nonfinite",
                                       "slot_exponent", "slot_length", "slot_flags",
                                       "head_round", "head_heard", "head_missing"};
static const char *COUNTER_NAMES[] = {"job_received", "job_stale", "job_held", "job_duplicates",
                                      "job_results", "job_aggregated", "job_lane_saturated",
                                      "job_lane_mismatch"};

static void Datapath_dealloc(Datapath *d) {
    release(d->bufs, 21);
    PyMem_Free(d->table);
    PyMem_Free(d->dests);
    PyMem_Free(d->dest_rank);
    PyMem_Free(d->hbuf);
    PyMem_Free(d->rbuf);
    PyMem_Free(d->obuf);
    PyMem_Free(d->smsg);
    PyMem_Free(d->siov);
    PyMem_Free(d->saddr);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

/* The array `name` of dict `arrays` into d->bufs[i]: `cells` items of `itemsize` bytes. */
static void *array(Datapath *d, int i, PyObject *arrays, const char *name, Py_ssize_t itemsize,
                   Py_ssize_t cells) {
    PyObject *obj = PyDict_GetItemString(arrays, name);
    if (!obj) {
        PyErr_Format(PyExc_KeyError, "no array %s", name);
        return NULL;
    }
    if (get_buf(obj, &d->bufs[i], 1, itemsize, name) < 0)
        return NULL;
    if (d->bufs[i].view.itemsize != itemsize || d->bufs[i].view.len < cells * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd-byte items, %zd bytes; want %zd-byte items, "
                     "at least %zd of them", name, d->bufs[i].view.itemsize, d->bufs[i].view.len,
                     itemsize, cells);
        return NULL;
    }
    return d->bufs[i].view.buf;
}

static PyObject *Datapath_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"fd", "registers", "counters", "pool_slots", "slot_capacity", NULL};
    int fd;
    PyObject *regs, *ctrs;
    Py_ssize_t pool, cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iO!O!nn", names, &fd, &PyDict_Type, &regs,
                                     &PyDict_Type, &ctrs, &pool, &cap))
        return NULL;
    if (pool <= 0 || cap <= 0) {
        PyErr_SetString(PyExc_ValueError, "pool_slots and slot_capacity must be positive");
        return NULL;
    }
    Datapath *d = (Datapath *)type->tp_alloc(type, 0);
    if (!d)
        return NULL;
    d->fd = fd;
    d->pool_slots = pool;
    d->capacity = cap;
    d->hold = 1;
    Py_ssize_t n = 2 * pool;
    if (!(d->round = array(d, 0, regs, REGISTER_NAMES[0], 4, n))
        || !(d->bitmap = array(d, 1, regs, REGISTER_NAMES[1], 4, n))
        || !(d->count = array(d, 2, regs, REGISTER_NAMES[2], 4, n))
        || !(d->values = array(d, 3, regs, REGISTER_NAMES[3], 4, n * cap))
        || !(d->next = array(d, 4, regs, REGISTER_NAMES[4], 4, n * MAX_LANES))
        || !(d->present = array(d, 5, regs, REGISTER_NAMES[5], 8, n))
        || !(d->nonfinite = array(d, 6, regs, REGISTER_NAMES[6], 8, n))
        || !(d->exponent = array(d, 7, regs, REGISTER_NAMES[7], 2, n))
        || !(d->length = array(d, 8, regs, REGISTER_NAMES[8], 4, n))
        || !(d->flags = array(d, 9, regs, REGISTER_NAMES[9], 1, n))
        || !(d->h_round = array(d, 10, regs, REGISTER_NAMES[10], 4, pool))
        || !(d->h_heard = array(d, 11, regs, REGISTER_NAMES[11], 4, pool))
        || !(d->h_missing = array(d, 12, regs, REGISTER_NAMES[12], 1, pool)))
        goto fail;
    uint64_t **c[] = {&d->c_received, &d->c_stale, &d->c_held, &d->c_duplicates, &d->c_results,
                      &d->c_aggregated, &d->c_lane_saturated, &d->c_lane_mismatch};
    for (int i = 0; i < 8; i++) {
        if (!(*c[i] = array(d, 13 + i, ctrs, COUNTER_NAMES[i], 8, 1)))
            goto fail;
        Py_ssize_t cells = d->bufs[13 + i].view.len / 8;
        if (i == 0 || cells < d->njobs)
            d->njobs = cells;
    }
    d->out_len = HEADER_LEN + 4 * MAX_LANES + 4 * cap;
    size_t nsend = (size_t)BATCH * MAX_WORKERS;
    d->rbuf = PyMem_Malloc((size_t)BATCH * RECV_SIZE);
    d->obuf = PyMem_Malloc((size_t)BATCH * (size_t)d->out_len);
    d->hbuf = PyMem_Malloc((size_t)BATCH * HEAD_MAX);
    d->smsg = PyMem_Calloc(nsend, sizeof *d->smsg);
    d->siov = PyMem_Calloc(nsend, sizeof *d->siov);
    d->saddr = PyMem_Calloc(nsend, sizeof *d->saddr);
    if (!d->rbuf || !d->obuf || !d->hbuf || !d->smsg || !d->siov || !d->saddr) {
        PyErr_NoMemory();
        goto fail;
    }
    for (int i = 0; i < BATCH; i++) {
        d->riov[i].iov_base = d->rbuf + (size_t)i * RECV_SIZE;
        d->riov[i].iov_len = RECV_SIZE;
        memset(&d->rmsg[i], 0, sizeof d->rmsg[i]);
        d->rmsg[i].msg_hdr.msg_name = &d->raddr[i];
        d->rmsg[i].msg_hdr.msg_iov = &d->riov[i];
        d->rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    return (PyObject *)d;
fail:
    Py_DECREF(d);
    return NULL;
}

static int parse_ipv4(PyObject *host, uint32_t *ip) {
    const char *s = PyUnicode_AsUTF8(host);
    struct in_addr a;
    if (!s)
        return -1;
    if (inet_pton(AF_INET, s, &a) != 1) {
        PyErr_Format(PyExc_ValueError, "%R is not an IPv4 address", host);
        return -1;
    }
    *ip = ntohl(a.s_addr);
    return 0;
}

PyDoc_STRVAR(set_tables_doc,
"set_tables(entries, destinations, hold[, scatter])\n\n"
"Replace the flat jobs' admission rows: entries are (ip, udp_port, job, rank, epoch, slot_base,\n"
"nslots, nworkers, block_size, nlanes, dest_first, dest_count); a result of an entry's job goes\n"
"to destinations[dest_first:dest_first + dest_count], each (ip, udp_port[, rank]). hold: the\n"
"pipeline's hold_newer_rounds. scatter: the UDP mode's own copies, served: reduce-scatter\n"
"rounds (a contribution's bitmap names the owners; a destination of another rank gets the\n"
"result's header only) and all-gather packets (to the job's workers but the sender); else\n"
"punted (the L2 mode's replicas are Python's).");

static PyObject *Datapath_set_tables(Datapath *d, PyObject *args) {
    PyObject *entries, *dests;
    int hold, scatter = 0;
    if (!PyArg_ParseTuple(args, "O!O!p|p", &PyList_Type, &entries, &PyList_Type, &dests, &hold,
                          &scatter))
        return NULL;
    Py_ssize_t ne = PyList_GET_SIZE(entries), nd = PyList_GET_SIZE(dests);
    uint32_t size = 16;
    while (size < 2 * (uint64_t)ne + 1)
        size <<= 1;
    Entry *table = PyMem_Calloc(size, sizeof *table);
    struct sockaddr_in *addrs = PyMem_Calloc(nd ? (size_t)nd : 1, sizeof *addrs);
    uint8_t *ranks = PyMem_Malloc(nd ? (size_t)nd : 1);
    if (!table || !addrs || !ranks) {
        PyMem_Free(table);
        PyMem_Free(addrs);
        PyMem_Free(ranks);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < nd; i++) {
        PyObject *host;
        int port, rank = NO_RANK;
        uint32_t ip;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(dests, i), "Oi|i", &host, &port, &rank)
            || parse_ipv4(host, &ip) < 0)
            goto fail;
        ranks[i] = (uint8_t)(rank >= 0 && rank < MAX_WORKERS ? rank : NO_RANK);
        addrs[i].sin_family = AF_INET;
        addrs[i].sin_addr.s_addr = htonl(ip);
        addrs[i].sin_port = htons((uint16_t)port);
    }
    for (Py_ssize_t i = 0; i < ne; i++) {
        PyObject *host;
        Entry e = {0};
        unsigned int port, job, rank, epoch;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(entries, i), "OIIIIIIIIIII", &host, &port, &job,
                              &rank, &epoch, &e.slot_base, &e.nslots, &e.nworkers, &e.block_size,
                              &e.nlanes, &e.dest_first, &e.dest_count)
            || parse_ipv4(host, &e.ip) < 0)
            goto fail;
        if (port > 0xFFFF || job >= (uint64_t)d->njobs || rank >= MAX_WORKERS || epoch > 0xFFFF
            || e.nworkers < 1 || e.nworkers > MAX_WORKERS
            || e.slot_base + (uint64_t)e.nslots > (uint64_t)d->pool_slots
            || e.nlanes < 1 || e.nlanes > MAX_LANES
            || (uint64_t)e.nlanes * e.block_size > (uint64_t)d->capacity
            || e.dest_first + (uint64_t)e.dest_count > (uint64_t)nd
            || e.dest_count > MAX_WORKERS) {
            PyErr_Format(PyExc_ValueError, "entry %zd is outside this switch's sizes", i);
            goto fail;
        }
        e.port = (uint16_t)port;
        e.job = (uint16_t)job;
        e.rank = (uint8_t)rank;
        e.epoch = (uint16_t)epoch;
        e.used = 1;
        uint32_t j = hash_key(e.ip, e.port, e.job, e.rank) & (size - 1);
        while (table[j].used && !(table[j].ip == e.ip && table[j].port == e.port
                                  && table[j].job == e.job && table[j].rank == e.rank))
            j = (j + 1) & (size - 1);
        table[j] = e;
    }
    PyMem_Free(d->table);
    PyMem_Free(d->dests);
    PyMem_Free(d->dest_rank);
    d->table = table;
    d->table_mask = size - 1;
    d->dests = addrs;
    d->dest_rank = ranks;
    d->ndests = (uint32_t)nd;
    d->hold = hold;
    d->scatter = scatter;
    Py_RETURN_NONE;
fail:
    PyMem_Free(table);
    PyMem_Free(addrs);
    PyMem_Free(ranks);
    return NULL;
}

static PyObject *address(const struct sockaddr_in *a) {
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    return Py_BuildValue("(si)", host, (int)ntohs(a->sin_port));
}

PyDoc_STRVAR(process_doc,
"process(packet, source, out) -> (n, to, destinations, stripped)\n\n"
"Run one datagram from source (ip, udp_port) as serve() would, without sockets: n = -1 if\n"
"Python's pipeline must take it (nothing was read or written), else the packet out[:n] (n = 0:\n"
"none) goes to = 1: every destination listed, 2: back to the source (a reduce-scatter reply\n"
"to a rank owning none of its round's blocks: out[:n] is the header-only copy already), 4: every\n"
"destination listed (an all-gather packet, the job's workers but the source);\n"
"stripped: the destinations of a reduce-scatter result's header-only copy (ScatterStrip).");

static PyObject *Datapath_process(Datapath *d, PyObject *args) {
    Buf b[2];
    memset(b, 0, sizeof b);
    PyObject *pkt, *src, *outobj, *host, *ret = NULL;
    int port;
    uint32_t ip;
    if (!PyArg_ParseTuple(args, "OOO", &pkt, &src, &outobj)
        || !PyArg_ParseTuple(src, "Oi", &host, &port) || parse_ipv4(host, &ip) < 0)
        return NULL;
    if (get_buf(pkt, &b[0], 0, 0, "packet") < 0 || get_buf(outobj, &b[1], 1, 0, "out") < 0)
        goto done;
    if (b[1].view.len < d->out_len) {
        PyErr_Format(PyExc_ValueError, "out: %zd bytes < %zd", b[1].view.len, d->out_len);
        goto done;
    }
    int to = 0;
    const Entry *e = NULL;
    Py_ssize_t n = process_one(d, b[0].view.buf, b[0].view.len, ip, (uint16_t)port,
                               b[1].view.buf, &to, &e);
    PyObject *dests = PyList_New(0), *stripped = PyList_New(0);
    if (!dests || !stripped) {
        Py_XDECREF(dests);
        Py_XDECREF(stripped);
        goto done;
    }
    uint32_t owners = n > 0 ? owners_of(b[0].view.buf, b[1].view.buf) : 0;
    if (n > 0 && to == TO_SENDER && !owns(owners, ((const uint8_t *)b[0].view.buf)[OFF_RANK]))
        n = strip_into(b[1].view.buf, b[1].view.buf);
    struct sockaddr_in from = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(ip)};
    if (n > 0 && (to == TO_GROUP || to == TO_OTHERS))
        for (uint32_t j = 0; j < e->dest_count; j++) {
            uint32_t x = e->dest_first + j;
            if (to == TO_OTHERS && same_address(&d->dests[x], &from))
                continue;
            PyObject *a = address(&d->dests[x]);
            if (!a || PyList_Append(owns(owners, d->dest_rank[x]) ? dests : stripped, a) < 0) {
                Py_XDECREF(a);
                Py_DECREF(dests);
                Py_DECREF(stripped);
                goto done;
            }
            Py_DECREF(a);
        }
    ret = Py_BuildValue("(niNN)", n, to, dests, stripped);
done:
    release(b, 2);
    return ret;
}

PyDoc_STRVAR(serve_doc,
"serve(budget) -> (outcome, packet, source)\n\n"
"Serve datagrams waiting on the socket (the caller holds the pipeline's lock): outcome 0, none\n"
"left now; 1, `budget` packets served and more may wait; 2, `packet` from `source` is for\n"
"Python's pipeline (every packet before it is served and its results sent).");

static PyObject *Datapath_serve(Datapath *d, PyObject *args) {
    long budget;
    int punt = -1, outcome;
    if (!PyArg_ParseTuple(args, "l", &budget))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    outcome = serve_loop(d, budget, &punt);
    Py_END_ALLOW_THREADS
    if (outcome != SERVE_PUNT)
        return Py_BuildValue("(iOO)", outcome, Py_None, Py_None);
    const struct sockaddr_in *a = &d->raddr[punt];
    PyObject *src = a->sin_family == AF_INET ? address(a) : Py_BuildValue("(si)", "", 0);
    if (!src)
        return NULL;
    return Py_BuildValue("(iy#N)", outcome, (const char *)d->rbuf + (Py_ssize_t)punt * RECV_SIZE,
                         (Py_ssize_t)d->rmsg[punt].msg_len, src);
}

static PyObject *Datapath_stats(Datapath *d, PyObject *unused) {
    return Py_BuildValue("{sKsKsKsKsK}", "packets_in", d->packets_in, "bytes_in", d->bytes_in,
                         "packets_out", d->packets_out, "bytes_out", d->bytes_out,
                         "send_errors", d->send_errors);
}

PyDoc_STRVAR(steer_doc,
"steer_by_slot(fd, shards)\n\n"
"Attach to the SO_REUSEPORT group of socket fd a classic BPF program that hands each datagram\n"
"to the group's socket number (INA header slot % shards), the sockets numbered in the order\n"
"they were bound. The kernel runs it with the UDP header pulled: offset 0 is the payload. A\n"
"datagram too short to have a slot goes to socket 0.");

static PyObject *steer_by_slot(PyObject *unused, PyObject *args) {
    int fd;
    unsigned int shards;
    if (!PyArg_ParseTuple(args, "iI", &fd, &shards))
        return NULL;
    if (shards < 1 || shards > 1024) {
        PyErr_SetString(PyExc_ValueError, "shards must be 1..1024");
        return NULL;
    }
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_H | BPF_ABS, OFF_SLOT),  /* big-endian u16; out of bounds: 0 */
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, shards),
        BPF_STMT(BPF_RET | BPF_A, 0),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"steer_by_slot", steer_by_slot, METH_VARARGS, steer_doc},
    {NULL, NULL, 0, NULL}};

static PyMethodDef Datapath_methods[] = {
    {"set_tables", (PyCFunction)Datapath_set_tables, METH_VARARGS, set_tables_doc},
    {"process", (PyCFunction)Datapath_process, METH_VARARGS, process_doc},
    {"serve", (PyCFunction)Datapath_serve, METH_VARARGS, serve_doc},
    {"stats", (PyCFunction)Datapath_stats, METH_NOARGS,
     "stats() -> the datagrams and bytes received and sent here, and failed sends"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject DatapathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "softswitch._datapath.Datapath",
    .tp_basicsize = sizeof(Datapath),
    .tp_dealloc = (destructor)Datapath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Datapath(fd, registers, counters, pool_slots, slot_capacity): the compiled UDP\n"
              "data path over a Pipeline's register and counter arrays and a socket's fd.",
    .tp_methods = Datapath_methods,
    .tp_new = Datapath_new,
};

/* The L2 mode's frames around process_one (FramePath): its own file, one translation unit. */
#include "_datapath_l2.c"

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_datapath",
                                    "The software switch's compiled UDP data path.", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__datapath(void) {
    if (PyType_Ready(&DatapathType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&DatapathType);
    if (PyModule_AddObject(m, "Datapath", (PyObject *)&DatapathType) < 0) {
        Py_DECREF(&DatapathType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyType_Ready(&FramePathType) < 0
        || PyModule_AddObject(m, "FramePath", Py_NewRef((PyObject *)&FramePathType)) < 0) {
        Py_DECREF(&FramePathType);
        Py_DECREF(m);
        return NULL;
    }
    /* what this file assumes of spina/wire.py, for tests/test_datapath.py to check */
    PyObject *offsets = Py_BuildValue(
        "{sisisisisisisisisisisisisisi}", "version", OFF_VERSION, "msg_type", OFF_MSG_TYPE,
        "flags", OFF_FLAGS, "job", OFF_JOB, "epoch", OFF_EPOCH, "slot", OFF_SLOT, "rank", OFF_RANK,
        "nlanes", OFF_NLANES, "round", OFF_ROUND, "length", OFF_LENGTH, "block_size",
        OFF_BLOCK_SIZE, "exponent", OFF_EXPONENT, "bitmap", OFF_BITMAP, "present", OFF_PRESENT);
    if (!offsets || PyDict_SetItemString(offsets, "nonfinite", PyLong_FromLong(OFF_NONFINITE)) < 0
        || PyModule_AddObject(m, "OFFSETS", offsets) < 0) {
        Py_XDECREF(offsets);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "HEADER_LEN", HEADER_LEN);
    PyModule_AddIntConstant(m, "MAX_LANES", MAX_LANES);
    PyModule_AddIntConstant(m, "BATCH", BATCH);
    return m;
}
