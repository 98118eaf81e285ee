/* The per-element kernels of the host agent's compiled core: the twins of host_agent/blocks.py
 * (quantize, dequantize, rounding_noise, stochastic_quantize, block_scan; tests/test_core.py
 * and tests/test_lanes.py check both give identical bytes). The rounds (_core_rounds.c) call
 * them a row at a time; the hot loops are built for AVX2 and for any CPU (use_avx2_loops). */
#include "_core.h"
#include <math.h>

/* x * 2**shift in float32, exact as blocks._scale: a multiply by the power of two where it
 * is a normal float32, else ldexpf (correctly rounded like numpy's ldexp). */
static inline float scale_f32(float x, int shift, float factor) {
    return (shift >= -126 && shift <= 127) ? x * factor : ldexpf(x, shift);
}

/* 2**shift as a float32 multiplier; 0 outside the normal range (the callers use ldexpf there) */
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

#ifdef HAVE_AVX2_VARIANT
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

Draws draws_for(uint64_t seed, uint64_t rank, uint64_t step) {
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

/* floor(s + u) for s = x 2**S and a draw u, in float32 (8 lanes a vector, where double had
 * 4): t = floor(s) (truncation corrected by one below it: |s| < 2**15 on a narrow lane), and
 * s + u reaches t + 1 iff u >= (t + 1) - s. Every quantity compared is exact in float32: for
 * s >= 0 it is compared as s - t >= 1 - u, for s < 0 as u >= (t + 1) - s; so q equals the
 * exact floor(x 2**S + u) wherever x 2**S is exact in float32 (not where it is subnormal):
 * blocks.stochastic_quantize, the same operations in numpy. */
static inline int32_t stochastic_floor(float s, float u) {
    float t = (float)(int32_t)s;
    t -= (float)(t > s);
    int pos = s >= 0.0f, a = s - t >= 1.0f - u, b = u >= (t + 1.0f) - s;
    return (int32_t)t + ((pos & a) | ((pos ^ 1) & b));  /* no branch: it vectorises */
}

/* The common case of a narrow row, built for AVX2 and for any CPU like the int32 loops:
 * q = stochastic_floor(x 2**shift, u) (x 2**shift one float32 product, as numpy's ldexp),
 * big-endian `item`-byte values; residual (or NULL): x - q 2**-shift in float32
 * (blocks.dequantize). up = 2**shift, down = 2**-shift, both normal. */
#define NARROW_LOOP(STORE, RESIDUAL)                                                       \
    for (Py_ssize_t j = 0; j < count; j++) {                                               \
        float x = src[j];                                                                  \
        int32_t q = stochastic_floor(x * up, draw_at(k0, k1, (uint32_t)(first + j)));       \
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
    float up, float down, uint32_t k0, uint32_t k1, uint64_t first, float *residual

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

/* One narrow lane's row of `item` (2 or 1) bytes a value, as narrow.NumpyRounds.fill writes it:
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
        narrow_scaled(dst, item, src, count, ldexpf(1.0f, shift), down, k0, k1, first, residual);
    } else {
        for (Py_ssize_t j = 0; j < count; j++) {
            float x = src[j];
            if (finite_only && !isfinite(x))
                x = 0.0f;
            int32_t q = stochastic_floor(ldexpf(x, shift), draw_at(k0, k1, (uint32_t)(first + j)));
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


PyDoc_STRVAR(add_keep_doc,
"add_keep(x, residual, out) -> None\n\n"
"out = x + residual in float32, and residual = out, in one pass over the three (out may be x):\n"
"narrow.add_keep's numpy operations, bit for bit.");

static PyObject *add_keep(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!nargs_is("add_keep", nargs, 3))
        return NULL;
    Buf b[3];
    memset(b, 0, sizeof b);
    PyObject *result = NULL;
    if (get_buf(args[0], &b[0], 0, 4, "x") || get_buf(args[1], &b[1], 1, 4, "residual")
        || get_buf(args[2], &b[2], 1, 4, "out"))
        goto done;
    if (b[1].view.len != b[0].view.len || b[2].view.len != b[0].view.len) {
        PyErr_SetString(PyExc_ValueError, "add_keep: x, residual and out must have one size");
        goto done;
    }
    const float *x = (const float *)b[0].view.buf;
    float *r = (float *)b[1].view.buf, *out = (float *)b[2].view.buf;
    Py_ssize_t n = b[0].view.len / 4;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < n; j++) {
        float v = x[j] + r[j];
        out[j] = v;
        r[j] = v;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release(b, 3);
    return result;
}


/* One present lane's row of a result into its block `dst` (`count` elements): int32 copied
 * (integer tensors), else dequantized to float32 and scaled by 2**ishift exactly as
 * blocks.dequantize does; narrow rows (item 2 or 1 bytes a value) as narrow.NumpyRounds.deliver
 * does. factor = pow2_f32(ishift). */
static void dequantize_row(char *dst, const unsigned char *src, Py_ssize_t count, int item,
                           int integer, int ishift, float factor) {
    int in_range = ishift >= -126 && ishift <= 127;
    float *f = (float *)dst;
    if (item < 4) {  /* narrow: int16/int8 to float32, then the exact scale (dequantize) */
        if (item == 2 && in_range)
            for (Py_ssize_t j = 0; j < count; j++)
                f[j] = (float)(int16_t)load_be16(src + 2 * j) * factor;
        else if (in_range)
            for (Py_ssize_t j = 0; j < count; j++)
                f[j] = (float)(int8_t)src[j] * factor;
        else
            for (Py_ssize_t j = 0; j < count; j++)
                f[j] = ldexpf(item == 2 ? (float)(int16_t)load_be16(src + 2 * j)
                                        : (float)(int8_t)src[j], ishift);
    } else if (integer) {
        uint32_t *d = (uint32_t *)dst;
        for (Py_ssize_t j = 0; j < count; j++)
            d[j] = load_be32(src + 4 * j);
    } else if (in_range) {
        dequantize_scaled(f, src, count, factor);
    } else {
        for (Py_ssize_t j = 0; j < count; j++)
            f[j] = ldexpf((float)(int32_t)load_be32(src + 4 * j), ishift);
    }
}

void quantize_rows(unsigned char *dst, const char *flat, const RowJob *rows, Py_ssize_t nrows,
                   Py_ssize_t bs, int integer, int shift) {
    float factor = pow2_f32(shift);
    for (Py_ssize_t r = 0; r < nrows; r++)
        quantize_row(dst + 4 * bs * r, flat + 4 * rows[r].start, rows[r].count, bs, integer,
                     rows[r].finite_only, shift, factor);
}

void narrow_rows(unsigned char *dst, int item, const float *flat, const RowJob *rows,
                 Py_ssize_t nrows, Py_ssize_t bs, int shift, const Draws *dr, float *residual) {
    for (Py_ssize_t r = 0; r < nrows; r++)
        narrow_row(dst + item * bs * r, item, flat + rows[r].start, rows[r].count, bs,
                   rows[r].finite_only, shift, dr, (uint64_t)rows[r].row * bs,
                   residual ? residual + rows[r].start : NULL);
}

void dequantize_rows(char *out, Py_ssize_t n, const unsigned char *src, uint64_t present,
                     const int64_t *pos, Py_ssize_t k, Py_ssize_t bs, int item, int integer,
                     int shift) {
    int ishift = -shift;
    float factor = pow2_f32(ishift);
    Py_ssize_t row = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!(present >> i & 1))
            continue;
        Py_ssize_t start = (Py_ssize_t)pos[i] * bs;
        dequantize_row(out + 4 * start, src + item * bs * row++, n - start < bs ? n - start : bs,
                       item, integer, ishift, factor);
    }
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


int use_avx2_loops(int on) {
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    if (on && __builtin_cpu_supports("avx2")) {
        quantize_scaled = quantize_avx2;
        dequantize_scaled = dequantize_avx2;
        scan_blocks = scan_avx2;
        narrow_scaled = narrow_avx2;
        return 1;
    }
#endif
    quantize_scaled = quantize_generic;
    dequantize_scaled = dequantize_generic;
    scan_blocks = scan_generic;
    narrow_scaled = narrow_generic;
    return 0;
}

PyMethodDef core_blocks_methods[] = {
    {"rounding_noise", (PyCFunction)(void (*)(void))rounding_noise, METH_FASTCALL,
     rounding_noise_doc},
    {"block_scan", (PyCFunction)(void (*)(void))block_scan, METH_FASTCALL, block_scan_doc},
    {"add_keep", (PyCFunction)(void (*)(void))add_keep, METH_FASTCALL, add_keep_doc},
    {NULL, NULL, 0, NULL},
};
