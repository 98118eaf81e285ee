/* The host agent's per-datagram work and its socket calls, compiled (issue 12, item 2).
 *
 * Per datagram, one C call per direction, each reading and writing every byte once:
 *
 *   fill_round  a contribution: per lane, is this worker's next own block the round's agreed
 *               position? then gather it from the tensor (the partial last block zero-padded,
 *               NaN/Inf as 0 in a block reported non-finite), quantize (x * 2**shift, rounded
 *               half to even) and store big-endian into the datagram; the lane's next own
 *               position after it goes into `next`; the header's per-round fields (flags,
 *               priority, round, exponent, present, nonfinite) are patched into the call's
 *               template, which the agent packs once per call. Narrow lanes (docs/bits.md):
 *               16- or 8-bit rows, each value stochastically rounded with the counter-based
 *               draws of (job, rank, call) (blocks.rounding_noise's), the error kept in the
 *               caller's residual (error feedback); written without the GIL.
 *   deliver     a result: dequantize each present lane's int32 (or narrow) sum (to float32,
 *               then * 2**-shift) and write it to its block of the output; NaN into the blocks a
 *               worker reported non-finite; then the result's `next` positions become the
 *               slot's next round.
 *
 * Per batch: recv_answers reads every datagram waiting (one recvmmsg) and checks each
 * (source address and port, the header checks of spina/wire.py header_error, job, epoch,
 * call, slot), handing the agent the answers' fields; send_batch sends the datagrams the
 * agent queued (one sendmmsg). answer_batch runs the answer loop's common case (a multicast
 * result to a round sent once: Recovery.result's and Recovery.sent's bookkeeping, deliver, the
 * slot's next round, queued) and hands every other answer back to the agent's Python path, in
 * arrival order; which packet gets which priority and flags, and every loss-recovery decision,
 * stay Python (host_agent/agent.py, recovery.py, dlcp.py; tests/test_agent_datapath.py runs
 * both paths and compares them bit for bit).
 *
 * The numpy forms in host_agent/blocks.py (quantize, dequantize, gather_blocks,
 * scatter_blocks, rounding_noise, stochastic_quantize), the agent's _fill_narrow and
 * _deliver_narrow, and spina/wire.py (HEADER_STRUCT, header_error) are the reference:
 * tests/test_core.py and tests/test_narrow_lanes.py check both give identical bytes and
 * verdicts.
 * Layout of a datagram: spina/wire.py (48-byte header, nlanes u32 `next`, present rows).
 */
#include "_pybuf.h"  /* Python.h, Buf, get_buf, release */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "../spina/_wire.h"  /* HEADER_LEN, OFF_*, MSG_*, FLAG_* (spina/wire.py) */

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

/* The per-round fields of a contribution's header (offsets: spina/wire.py HEADER_FIELDS; the
 * rest of the header is the call's template, packed once by the agent). */
static void write_header(unsigned char *h, int flags, int priority, uint32_t round_, int exponent,
                         uint64_t present, uint64_t nonfinite) {
    h[OFF_FLAGS] = (unsigned char)flags;
    h[OFF_PRIORITY] = (unsigned char)priority;
    store_be32(h + OFF_ROUND, round_);
    store_be16(h + OFF_EXPONENT, (uint16_t)(int16_t)exponent);
    store_be32(h + OFF_BITMAP, 0);
    store_be64(h + OFF_PRESENT, present);
    store_be64(h + OFF_NONFINITE, nonfinite);
}

/* x * 2**shift in float32, exact as blocks._scale: a multiply by the power of two where it
 * is a normal float32, else ldexpf (correctly rounded like numpy's ldexp). */
static inline float scale_f32(float x, int shift, float factor) {
    return (shift >= -126 && shift <= 127) ? x * factor : ldexpf(x, shift);
}

static float pow2_f32(int shift) {
    return (shift >= -126 && shift <= 127) ? ldexpf(1.0f, shift) : 0.0f;
}

/* The two hot loops, built twice: for AVX2 (gcc vectorises rounding, conversion and byte
 * swap: about 4x faster here) and for any x86-64/other CPU; chosen once at import. rintf and
 * lrintf both round half to even (the default rounding mode), as numpy's rint. */
#define QUANTIZE_LOOP(ROUND)                                                     \
    for (Py_ssize_t j = 0; j < count; j++)                                       \
        store_be32(dst + 4 * j, (uint32_t)(int32_t)ROUND(src[j] * factor));
#define DEQUANTIZE_LOOP                                                          \
    for (Py_ssize_t j = 0; j < count; j++)                                       \
        dst[j] = (float)(int32_t)load_be32(src + 4 * j) * factor;

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_VARIANT 1
__attribute__((target("avx2")))
static void quantize_avx2(unsigned char *dst, const float *src, Py_ssize_t count, float factor) {
    QUANTIZE_LOOP(rintf)
}
__attribute__((target("avx2")))
static void dequantize_avx2(float *dst, const unsigned char *src, Py_ssize_t count, float factor) {
    DEQUANTIZE_LOOP
}
#endif
static void quantize_generic(unsigned char *dst, const float *src, Py_ssize_t count, float factor) {
    QUANTIZE_LOOP(lrintf)
}
static void dequantize_generic(float *dst, const unsigned char *src, Py_ssize_t count, float factor) {
    DEQUANTIZE_LOOP
}
static void (*quantize_scaled)(unsigned char *, const float *, Py_ssize_t, float) = quantize_generic;
static void (*dequantize_scaled)(float *, const unsigned char *, Py_ssize_t, float) = dequantize_generic;

/* One lane's row: quantize (or copy, integer) `count` elements of `src`, zero-pad to `bs`,
 * big-endian into `dst`. */
static void quantize_row(unsigned char *dst, const void *src, Py_ssize_t count, Py_ssize_t bs,
                         int integer, int finite_only, int shift, float factor) {
    Py_ssize_t j;
    if (integer) {
        const uint32_t *s = (const uint32_t *)src;
        for (j = 0; j < count; j++)
            store_be32(dst + 4 * j, s[j]);
    } else if (finite_only) {  /* a block with NaN/Inf: those elements count as 0 */
        const float *s = (const float *)src;
        for (j = 0; j < count; j++) {
            float v = isfinite(s[j]) ? s[j] : 0.0f;
            store_be32(dst + 4 * j, (uint32_t)(int32_t)lrintf(scale_f32(v, shift, factor)));
        }
    } else if (shift >= -126 && shift <= 127) {  /* the usual case */
        quantize_scaled(dst, (const float *)src, count, factor);
    } else {
        const float *s = (const float *)src;
        for (j = 0; j < count; j++)
            store_be32(dst + 4 * j, (uint32_t)(int32_t)lrintf(ldexpf(s[j], shift)));
    }
    if (count < bs)
        memset(dst + 4 * count, 0, (size_t)(4 * (bs - count)));
}


/* ---- narrow lanes (docs/bits.md): stochastic rounding with counter-based draws ---- */

/* blocks.rounding_noise's generator: draw i of (seed, rank, step) is (h >> 8) * 2**-24 with
 * h = mix32(mix32(i + k0) ^ k1), (k0, k1) the low and high half of a splitmix64 chain over
 * seed, rank and step. Counter-based, so a row's draws need none before them; 32-bit integer
 * operations only, so gcc vectorises them (numpy's Philox, the first generator, took 2.7 ms
 * per million draws here and most of a narrow call's CPU). */
static inline uint64_t splitmix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    uint32_t k0, k1;
} Draws;

static Draws draws_for(uint64_t seed, uint64_t rank, uint64_t step) {
    uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ rank) ^ step);
    return (Draws){(uint32_t)key, (uint32_t)(key >> 32)};
}

/* lowbias32 (C. Wellons' integer hash search): a bijection of 32-bit words. */
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

static inline float draw_at(uint32_t k0, uint32_t k1, uint32_t i) {
    return (float)(int32_t)(mix32(mix32(i + k0) ^ k1) >> 8) * 0x1p-24f;
}

/* The common case of a narrow row, built for AVX2 and for any CPU like the int32 loops:
 * q = floor(x 2**shift + u) in double (x 2**shift exact, the add rounding once: numpy's
 * stochastic_quantize), the floor as truncation corrected by one below zero (exact: |q| <=
 * 2**(lane_bits - 2) by the shift), big-endian `item`-byte values; residual (or NULL):
 * x - q 2**-shift in float32 (blocks.dequantize). up = 2**shift, down = 2**-shift, both normal. */
#define NARROW_LOOP(STORE, RESIDUAL)                                                       \
    for (Py_ssize_t j = 0; j < count; j++) {                                               \
        float x = src[j];                                                                  \
        double s = (double)x * up + (double)draw_at(k0, k1, (uint32_t)(first + j));        \
        int32_t t = (int32_t)s, q = t - (s < (double)t);                                    \
        STORE;                                                                             \
        RESIDUAL;                                                                          \
    }
#define STORE16 uint16_t v_ = __builtin_bswap16((uint16_t)q); memcpy(dst + 2 * j, &v_, 2)
#define STORE8 dst[j] = (unsigned char)q
#define KEEP_ERROR residual[j] = x - (float)q * down
#define NARROW_BODY                                                                        \
    if (item == 2 && residual) NARROW_LOOP(STORE16, KEEP_ERROR)                             \
    else if (item == 2) NARROW_LOOP(STORE16, (void)0)                                      \
    else if (residual) NARROW_LOOP(STORE8, KEEP_ERROR)                                     \
    else NARROW_LOOP(STORE8, (void)0)
#define NARROW_ARGS unsigned char *dst, int item, const float *src, Py_ssize_t count,       \
    double up, float down, uint32_t k0, uint32_t k1, uint64_t first, float *residual

#ifdef HAVE_AVX2_VARIANT
__attribute__((target("avx2")))
static void narrow_avx2(NARROW_ARGS) {
    NARROW_BODY
}
#endif
static void narrow_generic(NARROW_ARGS) {
    NARROW_BODY
}
static void (*narrow_scaled)(NARROW_ARGS) = narrow_generic;

/* One narrow lane's row of `item` (2 or 1) bytes a value, as agent._fill_narrow writes it:
 * q = floor(x 2**shift + u) with u the draws from `first` (plan row * bs) on, big-endian;
 * zero-padded to bs (the padding's floor(0 + u) is 0); NaN/Inf count as 0 in a block reported
 * non-finite. residual (NULL: none): x - q 2**-shift in float32, 0 for a non-finite block:
 * what the lane did not carry. Shifts beyond float32's scale and non-finite blocks take a
 * scalar loop with ldexp, which gives what numpy's does. */
static void narrow_row(unsigned char *dst, int item, const float *src, Py_ssize_t count,
                       Py_ssize_t bs, int finite_only, int shift, const Draws *dr, uint64_t first,
                       float *residual) {
    uint32_t k0 = dr->k0, k1 = dr->k1;
    int in_range = -shift >= -126 && -shift <= 127;
    float down = in_range ? ldexpf(1.0f, -shift) : 0.0f;
    if (in_range && !finite_only) {
        narrow_scaled(dst, item, src, count, ldexp(1.0, shift), down, k0, k1, first, residual);
    } else {
        for (Py_ssize_t j = 0; j < count; j++) {
            float x = src[j];
            if (finite_only && !isfinite(x))
                x = 0.0f;
            double sum = ldexp((double)x, shift) + (double)draw_at(k0, k1, (uint32_t)(first + j));
            int32_t q = (int32_t)floor(sum);
            if (item == 2)
                store_be16(dst + 2 * j, (uint16_t)(int16_t)q);
            else
                dst[j] = (unsigned char)(int8_t)q;
            if (residual)
                residual[j] = finite_only ? 0.0f
                              : x - (in_range ? (float)q * down : ldexpf((float)q, -shift));
        }
    }
    if (count < bs)
        memset(dst + item * count, 0, (size_t)(item * (bs - count)));
}

PyDoc_STRVAR(rounding_noise_doc,
"rounding_noise(seed, rank, step, out) -> None\n\n"
"Fill `out` (float32) with blocks.rounding_noise(seed, rank, step, out.shape)'s values, bit\n"
"for bit (computed as fill_round computes a narrow row's draws).");

static PyObject *rounding_noise(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_is("rounding_noise", nargs, 4))
        return NULL;
    Draws dr = draws_for(PyLong_AsUnsignedLongLongMask(args[0]),
                         PyLong_AsUnsignedLongLongMask(args[1]),
                         PyLong_AsUnsignedLongLongMask(args[2]));
    Buf b;
    memset(&b, 0, sizeof b);
    if (PyErr_Occurred() || get_buf(args[3], &b, 1, 4, "out"))
        goto fail;
    float *out = (float *)b.view.buf;
    Py_ssize_t n = b.view.len / 4;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++)
        out[j] = draw_at(dr.k0, dr.k1, (uint32_t)j);
    Py_END_ALLOW_THREADS
    release(&b, 1);
    Py_RETURN_NONE;
fail:
    release(&b, 1);
    return NULL;
}

PyDoc_STRVAR(fill_round_doc,
"fill_round(datagram, flat, pos_ext, ptr, pos, nonfinite, lane0, shift, integer, block_size,\n"
"           round, flags, priority, exponent[, draws, residual])\n"
"    -> (present, nonfinite_bits, nrows, last)\n\n"
"Write one contribution's `next` positions and data rows into `datagram` (after its header),\n"
"and its header's per-round fields: flags (| LAST when nothing more follows), priority, round,\n"
"exponent, bitmap 0, present, nonfinite; the other header fields are the call's template,\n"
"packed once (the agent's _Call). pos None: a setup round (next positions only, no rows).\n"
"flat: the tensor (float32, or int32 if integer); pos_ext: int64 plan positions lane by lane,\n"
"each lane followed by the sentinel -1; ptr: int64 per lane, index into pos_ext of the lane's\n"
"first block not yet sent (advanced in place past the blocks sent now); pos: int64 per lane,\n"
"the round's agreed positions; nonfinite: None or uint8 per plan row (row = pos_ext index -\n"
"lane), 1 where the block holds NaN/Inf; lane0: the slot's first global lane. Returns the\n"
"present lane bitmap, the non-finite lane bitmap, the number of rows written, and whether\n"
"every lane's next position is END (nothing more to send).\n"
"A width flag in `flags` (FLAG_LANES16, FLAG_LANES8; float tensors) makes the rows narrow:\n"
"each value stochastically rounded with draws (seed, rank, step)'s values at plan row *\n"
"block_size on (blocks.rounding_noise), as agent._fill_narrow does; `residual` (None, or\n"
"float32 of flat's size) then takes each sent block's error (error feedback). The rows are\n"
"written without the GIL.");

/* A row fill_round sends: where its block starts in the tensor, its elements, plan row. */
typedef struct {
    Py_ssize_t start, count;
    int64_t row;
    int finite_only;
} RowJob;

static PyObject *fill_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[7] = {0};
    PyObject *result = NULL;
    if (nargs != 14 && nargs != 16) {
        PyErr_Format(PyExc_TypeError, "fill_round takes 14 or 16 arguments (%zd given)", nargs);
        return NULL;
    }
    long long lane0 = PyLong_AsLongLong(args[6]);
    long shift = PyLong_AsLong(args[7]);
    int integer = PyObject_IsTrue(args[8]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[9]);
    unsigned long round_ = PyLong_AsUnsignedLong(args[10]);
    long flags = PyLong_AsLong(args[11]), priority = PyLong_AsLong(args[12]);
    long exponent = PyLong_AsLong(args[13]);
    PyObject *draws_obj = nargs == 16 ? args[14] : Py_None;
    PyObject *residual_obj = nargs == 16 ? args[15] : Py_None;
    unsigned long long seed = 0, rank = 0, step = 0;
    if (PyErr_Occurred() || integer < 0
        || (draws_obj != Py_None && !PyArg_ParseTuple(draws_obj, "KKK", &seed, &rank, &step)))
        return NULL;
    Draws dr = draws_for(seed, rank, step);
    if (round_ > 0xFFFFFFFFul || flags < 0 || flags > 255 || priority < 0 || priority > 255
        || exponent < -32768 || exponent > 32767) {
        PyErr_SetString(PyExc_ValueError, "fill_round: round, flags, priority or exponent outside its field");
        return NULL;
    }
    int setup = args[4] == Py_None;
    int item = LANE_ITEM_BYTES(flags), narrow = item < 4;
    if (!item || (narrow && integer) || (narrow && !setup && draws_obj == Py_None)
        || (residual_obj != Py_None && !narrow)) {
        PyErr_SetString(PyExc_ValueError, "fill_round: one lane width; narrow lanes for float "
                        "tensors, with draws; a residual only with narrow lanes");
        return NULL;
    }
    if (get_buf(args[0], &b[0], 1, 0, "datagram") || get_buf(args[1], &b[1], 0, 4, "flat")
        || get_buf(args[2], &b[2], 0, 8, "pos_ext") || get_buf(args[3], &b[3], 1, 8, "ptr")
        || (!setup && get_buf(args[4], &b[4], 0, 8, "pos"))
        || (args[5] != Py_None && get_buf(args[5], &b[5], 0, 1, "nonfinite"))
        || (residual_obj != Py_None && get_buf(residual_obj, &b[6], 1, 4, "residual")))
        goto done;
    Py_ssize_t k = b[3].view.len / 8, n = b[1].view.len / 4, m = b[2].view.len / 8;
    Py_ssize_t nf_len = b[5].held ? b[5].view.len : 0;
    if (k < 1 || k > MAX_LANES || (!setup && b[4].view.len != 8 * k) || bs < 1) {
        PyErr_SetString(PyExc_ValueError, "fill_round: ptr and pos need 1..64 lanes each, block_size >= 1");
        goto done;
    }
    if (b[6].held && b[6].view.len != b[1].view.len) {
        PyErr_SetString(PyExc_ValueError, "fill_round: residual must have flat's size");
        goto done;
    }
    Py_ssize_t data_at = HEADER_LEN + 4 * k;
    if (b[0].view.len < data_at + item * k * bs) {
        PyErr_SetString(PyExc_ValueError, "fill_round: datagram too short for every lane's row");
        goto done;
    }
    if (shift < -100000 || shift > 100000) {
        PyErr_SetString(PyExc_ValueError, "fill_round: shift out of range");
        goto done;
    }
    unsigned char *dgram = (unsigned char *)b[0].view.buf;
    const char *flat = (const char *)b[1].view.buf;
    const int64_t *pos_ext = (const int64_t *)b[2].view.buf;
    int64_t *ptr = (int64_t *)b[3].view.buf;
    const int64_t *pos = setup ? NULL : (const int64_t *)b[4].view.buf;
    const unsigned char *nonfinite = b[5].held ? (const unsigned char *)b[5].view.buf : NULL;
    float *residual = b[6].held ? (float *)b[6].view.buf : NULL;
    uint64_t present = 0, nf_bits = 0;
    Py_ssize_t nrows = 0;
    RowJob jobs[MAX_LANES];
    int last = 1;
    /* first which lanes send which block (every index checked), then the rows */
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t p = ptr[i];
        if (p < 0 || p >= m) {
            PyErr_Format(PyExc_IndexError, "fill_round: ptr[%zd] = %lld outside pos_ext", i, (long long)p);
            goto done;
        }
        int64_t own = pos_ext[p];
        if (pos && own >= 0 && own == pos[i]) {
            if (own * bs >= n) {
                PyErr_Format(PyExc_IndexError, "fill_round: block %lld outside the tensor", (long long)own);
                goto done;
            }
            int64_t row = p - (lane0 + i);
            int finite_only = 0;
            if (nonfinite) {
                if (row < 0 || row >= nf_len) {
                    PyErr_Format(PyExc_IndexError, "fill_round: plan row %lld outside nonfinite", (long long)row);
                    goto done;
                }
                finite_only = nonfinite[row] != 0;
            }
            Py_ssize_t start = (Py_ssize_t)own * bs;
            jobs[nrows] = (RowJob){start, n - start < bs ? n - start : bs, row, finite_only};
            present |= 1ull << i;
            if (finite_only)
                nf_bits |= 1ull << i;
            nrows++;
            p = ++ptr[i];
            if (p >= m) {
                PyErr_SetString(PyExc_IndexError, "fill_round: a lane has no sentinel in pos_ext");
                goto done;
            }
        }
        int64_t next = pos_ext[p];
        store_be32(dgram + HEADER_LEN + 4 * i, next < 0 ? END_POS : (uint32_t)next);
        last &= next < 0;
    }
    if (narrow) {
        for (Py_ssize_t r = 0; r < nrows; r++)
            if (jobs[r].row < 0) {
                PyErr_Format(PyExc_IndexError, "fill_round: plan row %lld < 0",
                             (long long)jobs[r].row);
                goto done;
            }
        Py_BEGIN_ALLOW_THREADS  /* the draws make a narrow row cost several times an int32 one */
        for (Py_ssize_t r = 0; r < nrows; r++) {
            const RowJob *jb = &jobs[r];
            narrow_row(dgram + data_at + item * bs * r, item, (const float *)flat + jb->start,
                       jb->count, bs, jb->finite_only, (int)shift, &dr, (uint64_t)jb->row * bs,
                       residual ? residual + jb->start : NULL);
        }
        Py_END_ALLOW_THREADS
    } else {
        float factor = pow2_f32((int)shift);
        for (Py_ssize_t r = 0; r < nrows; r++)
            quantize_row(dgram + data_at + 4 * bs * r, flat + 4 * jobs[r].start, jobs[r].count,
                         bs, integer, jobs[r].finite_only, (int)shift, factor);
    }
    write_header(dgram, (int)flags | (last ? FLAG_LAST : 0), (int)priority, (uint32_t)round_,
                 (int)exponent, present, nf_bits);
    result = Py_BuildValue("(KKnO)", (unsigned long long)present, (unsigned long long)nf_bits,
                           nrows, last ? Py_True : Py_False);
done:
    release(b, 7);
    return result;
}

PyDoc_STRVAR(deliver_doc,
"deliver(datagram, out, pos, present, nonfinite, shift, integer, block_size[, width]) -> done\n\n"
"Write a result's rows into `out` (float32, or int32 if integer): the i-th present lane's row\n"
"goes to block pos[i] (int64 per lane), dequantized by 2**-shift (floats); blocks of the\n"
"`nonfinite` lanes become NaN. Only the first elements of the partial last block are written.\n"
"Then `pos` becomes the result's `next` positions (the next round's; END stays 2**32-1), and\n"
"`done` is whether every one of them is END (the slot's stream is complete).\n"
"width (optional, 0: int32): the rows' width flag (FLAG_LANES16, FLAG_LANES8; float outputs),\n"
"dequantized as agent._deliver_narrow does.");

static PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[3] = {0};
    PyObject *result = NULL;
    if (nargs != 8 && nargs != 9) {
        PyErr_Format(PyExc_TypeError, "deliver takes 8 or 9 arguments (%zd given)", nargs);
        return NULL;
    }
    long width = nargs == 9 ? PyLong_AsLong(args[8]) : 0;
    unsigned long long present = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long nf_bits = PyLong_AsUnsignedLongLong(args[4]);
    long shift = PyLong_AsLong(args[5]);
    int integer = PyObject_IsTrue(args[6]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred() || integer < 0)
        return NULL;
    int item = (width & ~FLAGS_LANE_WIDTH) ? 0 : LANE_ITEM_BYTES(width);
    if (!item || (item < 4 && integer)) {
        PyErr_SetString(PyExc_ValueError, "deliver: width is 0, FLAG_LANES16 or FLAG_LANES8 "
                        "(narrow: float outputs)");
        return NULL;
    }
    if (get_buf(args[0], &b[0], 0, 0, "datagram") || get_buf(args[1], &b[1], 1, 4, "out")
        || get_buf(args[2], &b[2], 1, 8, "pos"))
        goto done;
    Py_ssize_t k = b[2].view.len / 8, n = b[1].view.len / 4;
    if (k < 1 || k > MAX_LANES || bs < 1 || (k < 64 && ((present | nf_bits) >> k))) {
        PyErr_SetString(PyExc_ValueError, "deliver: 1..64 lanes, lane bits within them, block_size >= 1");
        goto done;
    }
    Py_ssize_t data_at = HEADER_LEN + 4 * k;
    if (b[0].view.len < data_at + item * bs * __builtin_popcountll(present)) {
        PyErr_SetString(PyExc_ValueError, "deliver: datagram shorter than its present rows");
        goto done;
    }
    if (shift < -100000 || shift > 100000) {
        PyErr_SetString(PyExc_ValueError, "deliver: shift out of range");
        goto done;
    }
    const unsigned char *dgram = (const unsigned char *)b[0].view.buf;
    char *out = (char *)b[1].view.buf;
    int64_t *pos = (int64_t *)b[2].view.buf;
    for (Py_ssize_t i = 0; i < k; i++) {  /* check every position before writing any */
        if (((present | nf_bits) >> i & 1) && (pos[i] < 0 || pos[i] * bs >= n)) {
            PyErr_Format(PyExc_IndexError, "deliver: block %lld outside the output", (long long)pos[i]);
            goto done;
        }
    }
    int ishift = -(int)shift;
    float factor = pow2_f32(ishift);
    int in_range = ishift >= -126 && ishift <= 127;
    Py_ssize_t row = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!(present >> i & 1))
            continue;
        Py_ssize_t start = (Py_ssize_t)pos[i] * bs;
        Py_ssize_t count = n - start < bs ? n - start : bs;
        const unsigned char *src = dgram + data_at + item * bs * row++;
        if (item < 4) {  /* narrow: int16/int8 to float32, then the exact scale (dequantize) */
            float *dst = (float *)(out + 4 * start);
            if (item == 2 && in_range)
                for (Py_ssize_t j = 0; j < count; j++)
                    dst[j] = (float)(int16_t)load_be16(src + 2 * j) * factor;
            else if (in_range)
                for (Py_ssize_t j = 0; j < count; j++)
                    dst[j] = (float)(int8_t)src[j] * factor;
            else
                for (Py_ssize_t j = 0; j < count; j++)
                    dst[j] = ldexpf(item == 2 ? (float)(int16_t)load_be16(src + 2 * j)
                                              : (float)(int8_t)src[j], ishift);
        } else if (integer) {
            uint32_t *dst = (uint32_t *)(out + 4 * start);
            for (Py_ssize_t j = 0; j < count; j++)
                dst[j] = load_be32(src + 4 * j);
        } else if (in_range) {
            dequantize_scaled((float *)(out + 4 * start), src, count, factor);
        } else {
            float *dst = (float *)(out + 4 * start);
            for (Py_ssize_t j = 0; j < count; j++)
                dst[j] = ldexpf((float)(int32_t)load_be32(src + 4 * j), ishift);
        }
    }
    if (nf_bits && !integer) {
        for (Py_ssize_t i = 0; i < k; i++) {
            if (!(nf_bits >> i & 1))
                continue;
            Py_ssize_t start = (Py_ssize_t)pos[i] * bs;
            Py_ssize_t count = n - start < bs ? n - start : bs;
            float *dst = (float *)(out + 4 * start);
            for (Py_ssize_t j = 0; j < count; j++)
                dst[j] = NAN;
        }
    }
    int all_end = 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        uint32_t next = load_be32(dgram + HEADER_LEN + 4 * i);
        pos[i] = next;
        all_end &= next == END_POS;
    }
    result = PyBool_FromLong(all_end);
done:
    release(b, 3);
    return result;
}

/* ---- the scan: which blocks hold values, and their largest magnitude ---- */

/* Per block of `bs` 4-byte items (the partial last block: its items only), one pass: the max
 * of the items' bits without the sign bit (a float32 |x| orders like these bits; 0: the block
 * is all +-0.0) and the OR of all their bits (non-zero: an int32 block with a value, or a
 * float block with some -0.0). Memory-bound: gcc vectorises both reductions together. `blocks`
 * NULL: every block in order; else only those (indices checked by the caller). */
#define SCAN_LOOP                                                                          \
    for (Py_ssize_t i = 0; i < nsel; i++) {                                                \
        Py_ssize_t start = (blocks ? (Py_ssize_t)blocks[i] : i) * bs;                      \
        Py_ssize_t count = n - start < bs ? n - start : bs;                                \
        const uint32_t *src = flat + start;                                                \
        int32_t m = 0; /* signed: |x| bits fit, and SSE2 has a signed compare */           \
        uint32_t o = 0;                                                                    \
        for (Py_ssize_t j = 0; j < count; j++) {                                           \
            uint32_t v = src[j];                                                           \
            int32_t a = (int32_t)(v & 0x7FFFFFFFu);                                        \
            m = a > m ? a : m;                                                             \
            o |= v;                                                                        \
        }                                                                                  \
        maxabs[i] = (uint32_t)m;                                                           \
        orbits[i] = o;                                                                     \
    }

#if defined(HAVE_AVX2_VARIANT)
__attribute__((target("avx2")))
static void scan_avx2(const uint32_t *flat, Py_ssize_t n, Py_ssize_t bs, const int64_t *blocks,
                      Py_ssize_t nsel, uint32_t *maxabs, uint32_t *orbits) {
    SCAN_LOOP
}
#endif
static void scan_generic(const uint32_t *flat, Py_ssize_t n, Py_ssize_t bs, const int64_t *blocks,
                         Py_ssize_t nsel, uint32_t *maxabs, uint32_t *orbits) {
    SCAN_LOOP
}
static void (*scan_blocks)(const uint32_t *, Py_ssize_t, Py_ssize_t, const int64_t *, Py_ssize_t,
                           uint32_t *, uint32_t *) = scan_generic;

PyDoc_STRVAR(block_scan_doc,
"block_scan(flat, block_size, maxabs, orbits, blocks) -> None\n\n"
"Per block of `flat` (4-byte items: float32 or int32; the partial last block has its items\n"
"only), in one pass: maxabs[i] = the largest item's bits with the sign bit cleared (for\n"
"float32 the bits of the largest |x|; 0 if every item is +-0), orbits[i] = the OR of every\n"
"item's bits. blocks None: every block, i = block index (maxabs and orbits: one 4-byte item\n"
"per block of the tensor); else int64 block indices, i = position in `blocks` (one item per\n"
"index). Releases the GIL while it reads.");

static PyObject *block_scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[4] = {0};
    PyObject *result = NULL;
    if (!nargs_is("block_scan", nargs, 5))
        return NULL;
    Py_ssize_t bs;
    if (block_size_arg(args[1], "block_scan", &bs) < 0)
        return NULL;
    if (get_buf(args[0], &b[0], 0, 4, "flat") || get_buf(args[2], &b[1], 1, 4, "maxabs")
        || get_buf(args[3], &b[2], 1, 4, "orbits")
        || (args[4] != Py_None && get_buf(args[4], &b[3], 0, 8, "blocks")))
        goto done;
    Py_ssize_t n = b[0].view.len / 4, nblocks = (n + bs - 1) / bs;
    const int64_t *blocks = b[3].held ? (const int64_t *)b[3].view.buf : NULL;
    Py_ssize_t nsel = blocks ? b[3].view.len / 8 : nblocks;
    if (b[1].view.len != 4 * nsel || b[2].view.len != 4 * nsel) {
        PyErr_Format(PyExc_ValueError, "block_scan: maxabs and orbits need %zd items each", nsel);
        goto done;
    }
    for (Py_ssize_t i = 0; blocks && i < nsel; i++)
        if (blocks[i] < 0 || blocks[i] >= nblocks) {
            PyErr_Format(PyExc_IndexError, "block_scan: block %lld outside 0..%zd",
                         (long long)blocks[i], nblocks - 1);
            goto done;
        }
    Py_BEGIN_ALLOW_THREADS
    scan_blocks((const uint32_t *)b[0].view.buf, n, bs, blocks, nsel, (uint32_t *)b[1].view.buf,
                (uint32_t *)b[2].view.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release(b, 4);
    return result;
}

/* ---- the socket side: every answer waiting in one recvmmsg, a batch of sends in one sendmmsg */

#define BATCH_MAX 64
enum { VERDICT_ANSWER = 0, VERDICT_FOREIGN = 1, VERDICT_MALFORMED = 2, VERDICT_OTHER = 3,
       VERDICT_GATHER = 4 };

typedef struct {
    long job, epoch, slot_base, nslots;
    unsigned long call;
} Expect;

/* What a datagram from the switch is to this call: malformed (spina/wire.py header_error, the
 * reference: tests/test_core.py compares), not an answer of this call (a contribution, another
 * job, epoch, call or slot: dropped unread, as the agent always did), an all-gather packet
 * (for the agent's all-gather, host_agent/allgather.py), or an answer of slot *slot_index
 * (whether it answers the round in flight is the agent's to decide). */
static int classify(const unsigned char *d, Py_ssize_t size, const Expect *e, long *slot_index) {
    if (size < HEADER_LEN)
        return VERDICT_MALFORMED;
    int msg_type = d[OFF_MSG_TYPE], nlanes = d[OFF_NLANES];
    uint64_t present = load_be64(d + OFF_PRESENT), nf = load_be64(d + OFF_NONFINITE);
    Py_ssize_t bs = load_be16(d + OFF_BLOCK_SIZE);
    if (d[OFF_VERSION] != WIRE_VERSION || msg_type < MSG_CONTRIB || msg_type > MSG_GATHER
        || nlanes < 1 || nlanes > MAX_LANES || bs == 0 || d[OFF_RANK] >= MAX_WORKERS
        || (nlanes < 64 && ((present | nf) >> nlanes)) || !LANE_ITEM_BYTES(d[OFF_FLAGS])
        || size != HEADER_LEN + 4 * nlanes
                   + LANE_ITEM_BYTES(d[OFF_FLAGS]) * bs * __builtin_popcountll(present))
        return VERDICT_MALFORMED;
    long s = (long)load_be16(d + OFF_SLOT) - e->slot_base;
    if (msg_type == MSG_GATHER)
        return VERDICT_GATHER;  /* no answer of this call: the agent's last all-gather's */
    if (msg_type == MSG_CONTRIB || load_be16(d + OFF_JOB) != e->job
        || load_be16(d + OFF_EPOCH) != e->epoch || s < 0 || s >= e->nslots
        || load_be32(d + OFF_CALL) != e->call)
        return VERDICT_OTHER;
    *slot_index = s;
    return VERDICT_ANSWER;
}

/* (index, slot index, msg_type, flags, round, exponent, bitmap, present, nonfinite, length,
 * nbytes): an answer's fields as the agent uses them (host_agent/agent.py _A_* names). */
static PyObject *answer_tuple(Py_ssize_t index, long slot_index, const unsigned char *d,
                              Py_ssize_t size) {
    return Py_BuildValue("(nliiIiIKKIn)", index, slot_index, (int)d[OFF_MSG_TYPE],
                         (int)d[OFF_FLAGS], (unsigned int)load_be32(d + OFF_ROUND),
                         (int)(int16_t)load_be16(d + OFF_EXPONENT),
                         (unsigned int)load_be32(d + OFF_BITMAP),
                         (unsigned long long)load_be64(d + OFF_PRESENT),
                         (unsigned long long)load_be64(d + OFF_NONFINITE),
                         (unsigned int)load_be32(d + OFF_LENGTH), size);
}

static int parse_expect(PyObject *const *args, Expect *e) {
    e->job = PyLong_AsLong(args[0]);
    e->epoch = PyLong_AsLong(args[1]);
    e->call = PyLong_AsUnsignedLong(args[2]);
    e->slot_base = PyLong_AsLong(args[3]);
    e->nslots = PyLong_AsLong(args[4]);
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(check_answer_doc,
"check_answer(datagram, nbytes, job, epoch, call, slot_base, nslots) -> (verdict, answer)\n\n"
"recv_answers' verdict on one datagram from the switch: 0 an answer of this call (answer: its\n"
"fields as recv_answers gives them, index 0), 2 malformed, 3 not an answer of this call,\n"
"4 a well-formed all-gather packet.");

static PyObject *check_answer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_is("check_answer", nargs, 7))
        return NULL;
    Buf b;
    memset(&b, 0, sizeof b);
    Expect e;
    Py_ssize_t size = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred() || parse_expect(args + 2, &e) || get_buf(args[0], &b, 0, 0, "datagram"))
        goto fail;
    if (size < 0 || size > b.view.len) {
        PyErr_SetString(PyExc_ValueError, "check_answer: nbytes outside the datagram");
        goto fail;
    }
    long slot_index = -1;
    int verdict = classify((const unsigned char *)b.view.buf, size, &e, &slot_index);
    PyObject *answer = verdict == VERDICT_ANSWER
        ? answer_tuple(0, slot_index, (const unsigned char *)b.view.buf, size) : Py_NewRef(Py_None);
    release(&b, 1);
    return answer ? Py_BuildValue("(iN)", verdict, answer) : NULL;
fail:
    release(&b, 1);
    return NULL;
}

PyDoc_STRVAR(recv_answers_doc,
"recv_answers(fd, ring, stride, switch_ip, switch_port, job, epoch, call, slot_base, nslots)\n"
"    -> (received, foreign, malformed, answers)\n\n"
"Read every datagram waiting on the non-blocking UDP socket `fd` (at most len(ring) // stride,\n"
"at most 64) with one recvmmsg, the i-th into ring[i * stride:]. Datagrams from anyone but\n"
"switch_ip:switch_port (an IPv4 address as a host-order int) are only counted (`foreign`);\n"
"`malformed` lists (index, nbytes) of the switch's datagrams that fail the header checks and\n"
"of its all-gather packets (verdict 4: Python hands them to the last all-gather call);\n"
"`answers` holds one tuple per answer of this call (check_answer's). received 0: nothing was\n"
"waiting. Errors of the socket (ECONNREFUSED: the switch's port is closed) raise OSError.");

static PyObject *recv_answers(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_is("recv_answers", nargs, 10))
        return NULL;
    int fd = PyLong_AsLong(args[0]);
    Py_ssize_t stride = PyLong_AsSsize_t(args[2]);
    unsigned long ip = PyLong_AsUnsignedLong(args[3]);
    long port = PyLong_AsLong(args[4]);
    Expect e;
    if (PyErr_Occurred() || parse_expect(args + 5, &e))
        return NULL;
    if (stride < HEADER_LEN || ip > 0xFFFFFFFFul || port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "recv_answers: stride, switch_ip or switch_port out of range");
        return NULL;
    }
    Buf b;
    memset(&b, 0, sizeof b);
    if (get_buf(args[1], &b, 1, 0, "ring"))
        return NULL;
    Py_ssize_t vlen = b.view.len / stride;
    if (vlen > BATCH_MAX)
        vlen = BATCH_MAX;
    if (vlen < 1) {
        release(&b, 1);
        PyErr_SetString(PyExc_ValueError, "recv_answers: ring shorter than one stride");
        return NULL;
    }
    struct mmsghdr msgs[BATCH_MAX];
    struct iovec iov[BATCH_MAX];
    struct sockaddr_in from[BATCH_MAX];
    unsigned char *ring = (unsigned char *)b.view.buf;
    memset(msgs, 0, sizeof(msgs[0]) * vlen);
    for (Py_ssize_t i = 0; i < vlen; i++) {
        iov[i].iov_base = ring + i * stride;
        iov[i].iov_len = (size_t)stride;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &from[i];
        msgs[i].msg_hdr.msg_namelen = sizeof from[i];
    }
    int got, err;
    for (;;) {
        Py_BEGIN_ALLOW_THREADS
        got = recvmmsg(fd, msgs, (unsigned int)vlen, MSG_DONTWAIT, NULL);
        err = errno;
        Py_END_ALLOW_THREADS
        if (got >= 0 || err != EINTR)
            break;
        if (PyErr_CheckSignals()) {
            release(&b, 1);
            return NULL;
        }
    }
    if (got < 0 && err != EAGAIN && err != EWOULDBLOCK) {
        release(&b, 1);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (got < 0)
        got = 0;
    Py_ssize_t foreign = 0;
    PyObject *malformed = PyList_New(0), *answers = PyList_New(0), *result = NULL;
    if (!malformed || !answers)
        goto done;
    uint32_t want_ip = htonl((uint32_t)ip);
    uint16_t want_port = htons((uint16_t)port);
    for (int i = 0; i < got; i++) {
        const struct sockaddr_in *a = &from[i];
        if (msgs[i].msg_hdr.msg_namelen < sizeof *a || a->sin_family != AF_INET
            || a->sin_addr.s_addr != want_ip || a->sin_port != want_port) {
            foreign++;  /* never read: only the switch answers */
            continue;
        }
        Py_ssize_t size = msgs[i].msg_len;
        const unsigned char *d = ring + i * stride;
        long slot_index = -1;
        int verdict = classify(d, size, &e, &slot_index);
        PyObject *item = NULL;
        if (verdict == VERDICT_MALFORMED || verdict == VERDICT_GATHER)
            item = Py_BuildValue("(in)", i, size);
        else if (verdict == VERDICT_ANSWER)
            item = answer_tuple(i, slot_index, d, size);
        else
            continue;
        if (!item || PyList_Append(verdict == VERDICT_ANSWER ? answers : malformed, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue("(inOO)", got, foreign, malformed, answers);
done:
    Py_XDECREF(malformed);
    Py_XDECREF(answers);
    release(&b, 1);
    return result;
}

PyDoc_STRVAR(send_batch_doc,
"send_batch(fd, datagrams, switch_ip, switch_port) -> lost\n\n"
"Send every datagram of the list (buffer objects) to switch_ip:switch_port with sendmmsg.\n"
"A datagram the host refuses (send buffer still full after waiting 0.1 s for room once,\n"
"ENOBUFS, EPERM from a firewall, ECONNREFUSED, no route) is lost like any other: counted in\n"
"`lost` and left to the agent's retransmission. Other errors raise OSError.");

static PyObject *send_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_is("send_batch", nargs, 4))
        return NULL;
    int fd = PyLong_AsLong(args[0]);
    unsigned long ip = PyLong_AsUnsignedLong(args[2]);
    long port = PyLong_AsLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(args[1]) || ip > 0xFFFFFFFFul || port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "send_batch: a list of datagrams, an IPv4 address and a port");
        return NULL;
    }
    Py_ssize_t total = PyList_GET_SIZE(args[1]), lost = 0;
    struct sockaddr_in to;
    memset(&to, 0, sizeof to);
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl((uint32_t)ip);
    to.sin_port = htons((uint16_t)port);
    for (Py_ssize_t start = 0; start < total; start += BATCH_MAX) {
        Py_ssize_t n = total - start < BATCH_MAX ? total - start : BATCH_MAX;
        Buf b[BATCH_MAX];
        struct mmsghdr msgs[BATCH_MAX];
        struct iovec iov[BATCH_MAX];
        memset(b, 0, sizeof(b[0]) * n);
        memset(msgs, 0, sizeof(msgs[0]) * n);
        for (Py_ssize_t i = 0; i < n; i++) {
            if (get_buf(PyList_GET_ITEM(args[1], start + i), &b[i], 0, 0, "datagram")) {
                release(b, (int)n);
                return NULL;
            }
            iov[i].iov_base = b[i].view.buf;
            iov[i].iov_len = (size_t)b[i].view.len;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &to;
            msgs[i].msg_hdr.msg_namelen = sizeof to;
        }
        Py_ssize_t done = 0;
        int waited = 0;
        while (done < n) {
            int sent, err;
            Py_BEGIN_ALLOW_THREADS
            sent = sendmmsg(fd, msgs + done, (unsigned int)(n - done), 0);
            err = errno;
            Py_END_ALLOW_THREADS
            if (sent > 0) {
                done += sent;
                waited = 0;
                continue;
            }
            if (sent == 0 || err == EINTR) {
                if (PyErr_CheckSignals()) {
                    release(b, (int)n);
                    return NULL;
                }
                continue;
            }
            if ((err == EAGAIN || err == EWOULDBLOCK) && !waited) {  /* send buffer full */
                struct pollfd p = {fd, POLLOUT, 0};
                Py_BEGIN_ALLOW_THREADS
                poll(&p, 1, 100);
                Py_END_ALLOW_THREADS
                waited = 1;
                continue;
            }
            if (err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == EPERM
                || err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH) {
                lost++;  /* this datagram is lost; the retransmission timer recovers it */
                done++;
                waited = 0;
                continue;
            }
            release(b, (int)n);
            errno = err;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        release(b, (int)n);
    }
    return PyLong_FromSsize_t(lost);
}

/* ---- the answer loop's common case: result -> deliver -> next round -> queue ---- */

/* Attribute names of the agent's objects this loop reads and writes (host_agent/agent.py
 * _Slot, CallStats; host_agent/recovery.py Timer, Recovery, RttEstimator), interned once. */
#define ATTR_NAMES(X) X(done) X(setup) X(round) X(timer) X(pos) X(ptr) X(shift) X(exponent) \
    X(packet) X(view) X(resends) X(statuses) X(flush) X(group) X(first_sent_at) X(seq)        \
    X(last_seq) X(timed_out) X(hold_resent) X(progress_at) X(unanswered) X(prev_round)        \
    X(prev_resends) X(prev_timed_out) X(prev_hold_resent) X(held_for) X(hold_risk)             \
    X(prev_latency) X(sent_at) X(flushable) X(srtt) X(rttvar) X(timer_from) X(backoff)         \
    X(recheck) X(packets_received) X(bytes_received) X(rounds) X(packets_sent) X(bytes_sent)   \
    X(payload_bytes_sent)
#define ATTR_DECL(n) static PyObject *s_##n;
ATTR_NAMES(ATTR_DECL)
#define ATTR_INIT(n) if ((s_##n = PyUnicode_InternFromString(#n)) == NULL) return -1;
static int init_attr_names(void) {
    ATTR_NAMES(ATTR_INIT)
    return 0;
}

/* setattr(o, name, x), taking over the new reference `x` (NULL: its constructor failed) */
static int set_attr_new(PyObject *o, PyObject *name, PyObject *x) {
    if (x == NULL)
        return -1;
    int r = PyObject_SetAttr(o, name, x);
    Py_DECREF(x);
    return r;
}
#define set_attr_ll(o, name, v) set_attr_new(o, name, PyLong_FromLongLong(v))
#define set_attr_double(o, name, v) set_attr_new(o, name, PyFloat_FromDouble(v))

/* getattr(o, name) as a long long / double / truth value; -1 (-1.0) with an exception on
 * failure (the caller checks PyErr_Occurred). */
#define ATTR_GETTER(fn, T, convert, failed)                                                \
    static T fn(PyObject *o, PyObject *name) {                                              \
        PyObject *x = PyObject_GetAttr(o, name);                                            \
        if (x == NULL)                                                                      \
            return failed;                                                                  \
        T v = convert(x);                                                                   \
        Py_DECREF(x);                                                                       \
        return v;                                                                           \
    }
ATTR_GETTER(attr_ll, long long, PyLong_AsLongLong, -1)
ATTR_GETTER(attr_double, double, PyFloat_AsDouble, -1.0)
ATTR_GETTER(attr_true, int, PyObject_IsTrue, -1)

static int add_attr_ll(PyObject *o, PyObject *name, long long delta) {
    if (!delta)
        return 0;
    long long v = attr_ll(o, name);
    return PyErr_Occurred() ? -1 : set_attr_ll(o, name, v + delta);
}

/* flying.pop(key, None) */
static int dict_discard(PyObject *d, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(d, key);
    if (v == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return PyDict_DelItem(d, key);
}

/* Whether answer `a` (recv_answers' fields) is the common case this loop handles: a
 * multicast result (not a stored one for a resend, not PARTIAL, no length mismatch) to its
 * slot's data round in flight, in the call's lane width, which was sent once and got no
 * status; and the agent has a latency estimate. 1 yes, 0 no (the agent's Python path takes it), -1 error. */
static int common_answer(PyObject *a, PyObject *st, PyObject *tm, long width) {
    long long msg_type = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 2));
    long long flags = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 3));
    unsigned long long round_ = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(a, 4));
    if (PyErr_Occurred())
        return -1;
    if (msg_type != MSG_RESULT || (flags & (FLAG_MISMATCH | FLAG_PARTIAL | FLAG_RESEND))
        || (flags & FLAGS_LANE_WIDTH) != width)  /* another width: the agent raises */
        return 0;
    int v;
    if ((v = attr_true(st, s_done)) != 0 || (v = attr_true(st, s_setup)) != 0)
        return v < 0 ? -1 : 0;
    long long st_round = attr_ll(st, s_round);
    if (PyErr_Occurred())
        return -1;
    if ((unsigned long long)st_round != round_)
        return 0;
    if ((v = attr_true(tm, s_resends)) != 0 || (v = attr_true(tm, s_statuses)) != 0
        || (v = attr_true(tm, s_flush)) != 0)
        return v < 0 ? -1 : 0;
    return 1;
}

/* The context answer_batch takes (agent.py _Call.compiled builds it once per call). */
enum { C_SLOTS, C_STATS, C_REC, C_RTT, C_FLYING, C_RACK, C_GROUP_SRTT, C_ROUNDS, C_FLAT, C_OUT,
       C_POS_EXT, C_NONFINITE, C_K, C_B, C_INTEGER, C_NEXT_END, C_PRIORITY, C_OUTBOX, C_BUFS,
       C_WIDTH, C_DRAWS, C_RESIDUAL, C_LEN };

PyDoc_STRVAR(answer_batch_doc,
"answer_batch(ctx, answers, views, start, now) -> (stop, finished)\n\n"
"Handle answers[start:] (recv_answers' tuples; the i-th datagram in views[answers[i][0]]) in\n"
"order, as host_agent/agent.py _Call.answer does, while each is the common case: a multicast\n"
"result to its slot's data round in flight, sent once, no status, the agent's latency\n"
"estimated. Per answer: Recovery.result's bookkeeping (latency sample, RACK, flying), deliver\n"
"into the output, then the slot's next round (fill_round) queued as _queue does (Recovery.sent)\n"
"- or the slot marked done. Stops at the first other answer: the agent's Python path handles\n"
"it, then calls again after it. `ctx`: _Call.compiled's tuple; `now`: the batch's time.\n"
"Returns the index it stopped at and how many slots finished.");

static PyObject *answer_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != C_LEN
        || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyFloat_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "answer_batch(ctx tuple, answers list, views list, start, now float)");
        return NULL;
    }
    PyObject *const *ctx = &PyTuple_GET_ITEM(args[0], 0);
    PyObject *answers = args[1], *views = args[2], *now = args[4];
    PyObject *slots = ctx[C_SLOTS], *stats = ctx[C_STATS], *rec = ctx[C_REC], *rtt = ctx[C_RTT];
    PyObject *flying = ctx[C_FLYING], *rack = ctx[C_RACK], *group_srtt = ctx[C_GROUP_SRTT];
    PyObject *bufs = ctx[C_BUFS], *outbox = ctx[C_OUTBOX];
    if (!PyList_Check(slots) || !PyDict_Check(flying) || !PyDict_Check(rack)
        || !PyDict_Check(group_srtt) || !PyList_Check(bufs) || !PyList_Check(outbox)) {
        PyErr_SetString(PyExc_TypeError, "answer_batch: ctx holds the wrong types");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    long long k = PyLong_AsLongLong(ctx[C_K]), bs = PyLong_AsLongLong(ctx[C_B]);
    long long next_end = PyLong_AsLongLong(ctx[C_NEXT_END]);
    long width = PyLong_AsLong(ctx[C_WIDTH]);  /* the call's lane width flag (0: int32) */
    long long row_bytes = (long long)LANE_ITEM_BYTES(width) * bs;
    double t_now = PyFloat_AS_DOUBLE(now);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(answers), nslots = PyList_GET_SIZE(slots);
    if (i < 0 || i > n) {
        PyErr_SetString(PyExc_IndexError, "answer_batch: start outside answers");
        return NULL;
    }
    Buf rb;
    memset(&rb, 0, sizeof rb);
    if (get_buf(ctx[C_ROUNDS], &rb, 1, 8, "rounds"))
        goto fail;
    if (rb.view.len / 8 < nslots) {
        PyErr_SetString(PyExc_ValueError, "answer_batch: rounds shorter than the slots");
        goto fail;
    }
    int64_t *rounds = (int64_t *)rb.view.buf;
    PyObject *srtt_obj = PyObject_GetAttr(rtt, s_srtt);
    if (srtt_obj == NULL)
        goto fail;
    int estimated = srtt_obj != Py_None;  /* the first sample is the Python path's */
    double srtt = estimated ? PyFloat_AsDouble(srtt_obj) : 0.0;
    Py_DECREF(srtt_obj);
    double rttvar = attr_double(rtt, s_rttvar);
    long long seq = attr_ll(rec, s_seq);
    if (PyErr_Occurred())
        goto fail;
    long long received = 0, bytes_received = 0, nrounds = 0, sent = 0, bytes_sent = 0;
    long long payload = 0, finished = 0;
    int recheck = 0;
    for (; estimated && i < n; i++) {
        PyObject *a = PyList_GET_ITEM(answers, i);
        if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 11) {
            PyErr_SetString(PyExc_TypeError, "answer_batch: an answer is not recv_answers' tuple");
            goto fail;
        }
        long long index = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 0));
        long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 1));
        long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 10));
        if (PyErr_Occurred())
            goto fail;
        if (s < 0 || s >= nslots || index < 0 || index >= PyList_GET_SIZE(views)) {
            PyErr_SetString(PyExc_IndexError, "answer_batch: slot or ring index out of range");
            goto fail;
        }
        PyObject *st = PyList_GET_ITEM(slots, s);
        PyObject *tm = PyObject_GetAttr(st, s_timer);
        if (tm == NULL)
            goto fail;
        int common = common_answer(a, st, tm, width);
        if (common <= 0) {
            Py_DECREF(tm);
            if (common < 0)
                goto fail;
            break;
        }
        /* Recovery.result(tm, st.round, now, multicast=True, partial=False, held_for=0) */
        PyObject *round_obj = PyTuple_GET_ITEM(a, 4);
        PyObject *group = NULL, *last_seq = NULL, *tm_seq = NULL, *latency_obj = NULL;
        PyObject *r = NULL, *x = NULL;
        int err = 1;
        double first_sent_at = attr_double(tm, s_first_sent_at);
        if (PyErr_Occurred() || PyObject_SetAttr(tm, s_progress_at, now)
            || set_attr_ll(tm, s_unanswered, 0)
            || (last_seq = PyObject_GetAttr(tm, s_last_seq)) == NULL
            || dict_discard(flying, last_seq) || (group = PyObject_GetAttr(tm, s_group)) == NULL)
            goto answer_done;
        /* RttEstimator.sample in its order of operations: bit-identical doubles (no FMA:
         * this file's baseline x86-64 code cannot contract a * b + c) */
        double latency = t_now - first_sent_at;
        rttvar = 0.75 * rttvar + 0.25 * fabs(srtt - latency);
        srtt = 0.875 * srtt + 0.125 * latency;
        PyObject *g = PyDict_GetItemWithError(group_srtt, group);
        if (g == NULL && PyErr_Occurred())
            goto answer_done;
        double gs = g == NULL ? latency : 0.875 * PyFloat_AsDouble(g) + 0.125 * latency;
        if (PyErr_Occurred() || (latency_obj = PyFloat_FromDouble(latency)) == NULL
            || (x = PyFloat_FromDouble(gs)) == NULL || PyDict_SetItem(group_srtt, group, x))
            goto answer_done;
        /* RACK: the latest-sent round known answered, per slot group */
        if ((tm_seq = PyObject_GetAttr(tm, s_seq)) == NULL)
            goto answer_done;
        long long tseq = PyLong_AsLongLong(tm_seq), rack_seq = 0;
        r = PyDict_GetItemWithError(rack, group);
        if (r != NULL)
            rack_seq = PyLong_AsLongLong(PyTuple_GetItem(r, 0));
        r = NULL;
        if (PyErr_Occurred())
            goto answer_done;
        if (tseq > rack_seq) {
            if ((r = PyTuple_Pack(2, tm_seq, latency_obj)) == NULL
                || PyDict_SetItem(rack, group, r))
                goto answer_done;
            Py_ssize_t at = 0;
            PyObject *first, *val;
            if (PyDict_Next(flying, &at, &first, &val)) {
                long long f = PyLong_AsLongLong(first);
                if (PyErr_Occurred())
                    goto answer_done;
                recheck |= f < tseq;
            }
        }
        PyObject *timed_out = NULL, *hold_resent = NULL;
        if ((timed_out = PyObject_GetAttr(tm, s_timed_out)) == NULL
            || (hold_resent = PyObject_GetAttr(tm, s_hold_resent)) == NULL) {
            Py_XDECREF(timed_out);
            goto answer_done;
        }
        int e = PyObject_SetAttr(tm, s_prev_round, round_obj)
            || set_attr_ll(tm, s_prev_resends, 0)
            || PyObject_SetAttr(tm, s_prev_timed_out, timed_out)
            || PyObject_SetAttr(tm, s_prev_hold_resent, hold_resent)
            || set_attr_ll(tm, s_held_for, 0) || PyObject_SetAttr(tm, s_hold_risk, Py_False)
            || PyObject_SetAttr(tm, s_prev_latency, latency_obj);
        Py_DECREF(timed_out);
        Py_DECREF(hold_resent);
        if (e)
            goto answer_done;
        received++;
        bytes_received += nbytes;
        /* deliver: the sums into their blocks; st.pos becomes the next round's positions */
        PyObject *pos = PyObject_GetAttr(st, s_pos), *shift = PyObject_GetAttr(st, s_shift);
        if (pos == NULL || shift == NULL) {
            Py_XDECREF(pos);
            Py_XDECREF(shift);
            goto answer_done;
        }
        PyObject *dargs[9] = {PyList_GET_ITEM(views, index), ctx[C_OUT], pos,
                              PyTuple_GET_ITEM(a, 7), PyTuple_GET_ITEM(a, 8), shift,
                              ctx[C_INTEGER], ctx[C_B], ctx[C_WIDTH]};
        PyObject *done = deliver(NULL, dargs, 9);
        if (done == NULL) {
            Py_DECREF(pos);
            Py_DECREF(shift);
            goto answer_done;
        }
        nrounds++;
        if (done == Py_True) {
            Py_DECREF(done);
            Py_DECREF(pos);
            Py_DECREF(shift);
            finished++;
            err = PyObject_SetAttr(st, s_done, Py_True) < 0;
            goto answer_done;
        }
        Py_DECREF(done);
        /* _next_round without bounded loss or droppable packets: the job's priority, no
         * extra flags but the lane width; _new_round's tag */
        int64_t tag = rounds[s] + 1;
        rounds[s] = tag;
        PyObject *ptr = PyObject_GetAttr(st, s_ptr), *expo = PyObject_GetAttr(st, s_exponent);
        PyObject *rnd = PyLong_FromUnsignedLongLong((uint64_t)tag & 0xFFFFFFFFu);
        PyObject *lane0 = PyLong_FromLongLong(s * k);
        PyObject *buf = PyList_Check(bufs) && s < PyList_GET_SIZE(bufs)
            ? PyTuple_GetItem(PyList_GET_ITEM(bufs, s), 0) : NULL;
        PyObject *filled = NULL;
        if (ptr && expo && rnd && lane0 && buf && PyObject_SetAttr(st, s_round, rnd) == 0) {
            PyObject *fargs[16] = {buf, ctx[C_FLAT], ctx[C_POS_EXT], ptr, pos, ctx[C_NONFINITE],
                                   lane0, shift, ctx[C_INTEGER], ctx[C_B], rnd, ctx[C_WIDTH],
                                   ctx[C_PRIORITY], expo, ctx[C_DRAWS], ctx[C_RESIDUAL]};
            filled = fill_round(NULL, fargs, 16);
        } else if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_IndexError, "answer_batch: no datagram buffer for the slot");
        }
        Py_XDECREF(ptr);
        Py_XDECREF(expo);
        Py_XDECREF(rnd);
        Py_XDECREF(lane0);
        Py_DECREF(pos);
        Py_DECREF(shift);
        if (filled == NULL)
            goto answer_done;
        long long nrows = PyLong_AsLongLong(PyTuple_GET_ITEM(filled, 2));
        Py_DECREF(filled);
        /* _queue: the datagram's view, Recovery.sent(tm, now, flushable=True), the outbox */
        long long len = next_end + row_bytes * nrows;
        PyObject *view = PyObject_GetAttr(st, s_view), *packet = NULL;
        if (view != NULL)
            packet = PySequence_GetSlice(view, 0, (Py_ssize_t)len);
        Py_XDECREF(view);
        if (packet == NULL)
            goto answer_done;
        seq++;
        PyObject *seq_obj = PyLong_FromLongLong(seq);
        e = seq_obj == NULL || PyObject_SetAttr(st, s_packet, packet)
            || dict_discard(flying, last_seq) || PyDict_SetItem(flying, seq_obj, tm)
            || PyObject_SetAttr(tm, s_seq, seq_obj) || PyObject_SetAttr(tm, s_last_seq, seq_obj)
            || PyObject_SetAttr(tm, s_first_sent_at, now) || PyObject_SetAttr(tm, s_sent_at, now)
            || set_attr_ll(tm, s_resends, 0) || set_attr_ll(tm, s_statuses, 0)
            || PyObject_SetAttr(tm, s_flush, Py_False)
            || PyObject_SetAttr(tm, s_timed_out, Py_False)
            || PyObject_SetAttr(tm, s_hold_resent, Py_False)
            || PyObject_SetAttr(tm, s_flushable, Py_True) || PyList_Append(outbox, packet);
        Py_XDECREF(seq_obj);
        Py_DECREF(packet);
        if (e)
            goto answer_done;
        sent++;
        bytes_sent += len;
        payload += row_bytes * nrows;
        err = 0;
answer_done:
        Py_XDECREF(group);
        Py_XDECREF(last_seq);
        Py_XDECREF(tm_seq);
        Py_XDECREF(latency_obj);
        Py_XDECREF(r);
        Py_XDECREF(x);
        Py_DECREF(tm);
        if (err)
            goto fail;
    }
    release(&rb, 1);
    /* what the Python path keeps per answer, written back once per batch */
    if (received && (PyObject_SetAttr(rec, s_timer_from, now) || set_attr_ll(rec, s_backoff, 0)
                     || set_attr_double(rtt, s_srtt, srtt)
                     || set_attr_double(rtt, s_rttvar, rttvar)))
        return NULL;
    if (set_attr_ll(rec, s_seq, seq) || (recheck && PyObject_SetAttr(rec, s_recheck, Py_True))
        || add_attr_ll(stats, s_packets_received, received)
        || add_attr_ll(stats, s_bytes_received, bytes_received)
        || add_attr_ll(stats, s_rounds, nrounds) || add_attr_ll(stats, s_packets_sent, sent)
        || add_attr_ll(stats, s_bytes_sent, bytes_sent)
        || add_attr_ll(stats, s_payload_bytes_sent, payload))
        return NULL;
    return Py_BuildValue("(nL)", i, finished);
fail:
    release(&rb, 1);
    return NULL;
}

PyDoc_STRVAR(set_variant_doc,
"set_variant(name)\n\nUse the 'avx2' or the 'generic' loops (tests compare both with the reference).");

static PyObject *set_variant(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    if (strcmp(name, "generic") == 0) {
        quantize_scaled = quantize_generic;
        dequantize_scaled = dequantize_generic;
        scan_blocks = scan_generic;
        narrow_scaled = narrow_generic;
#ifdef HAVE_AVX2_VARIANT
    } else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        quantize_scaled = quantize_avx2;
        dequantize_scaled = dequantize_avx2;
        scan_blocks = scan_avx2;
        narrow_scaled = narrow_avx2;
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "variant %R: 'generic', or 'avx2' on a CPU that has it", arg);
        return NULL;
    }
    if (PyModule_AddStringConstant(self, "VARIANT", name) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_variant", set_variant, METH_O, set_variant_doc},
    {"fill_round", (PyCFunction)(void (*)(void))fill_round, METH_FASTCALL, fill_round_doc},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL, deliver_doc},
    {"rounding_noise", (PyCFunction)(void (*)(void))rounding_noise, METH_FASTCALL,
     rounding_noise_doc},
    {"block_scan", (PyCFunction)(void (*)(void))block_scan, METH_FASTCALL, block_scan_doc},
    {"check_answer", (PyCFunction)(void (*)(void))check_answer, METH_FASTCALL, check_answer_doc},
    {"recv_answers", (PyCFunction)(void (*)(void))recv_answers, METH_FASTCALL, recv_answers_doc},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL, send_batch_doc},
    {"answer_batch", (PyCFunction)(void (*)(void))answer_batch, METH_FASTCALL, answer_batch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "host_agent._core",
    "The host agent's per-datagram data work, compiled (host_agent/_core.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__core(void) {
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        quantize_scaled = quantize_avx2;
        dequantize_scaled = dequantize_avx2;
        scan_blocks = scan_avx2;
        narrow_scaled = narrow_avx2;
    }
#endif
    if (init_attr_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "VARIANT", quantize_scaled == quantize_generic
                                        ? "generic" : "avx2") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
