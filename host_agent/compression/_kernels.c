/* The compressor's per-bucket work, compiled (issue 33, item 1).
 *
 *   accumulate   one pass over the bucket: the error feedback v += x, with DGC's momentum
 *                correction first (u = m * u + g, x = u; else x = g), each parameter's piece
 *                of the unaligned bucket at its block-aligned offset, and each block's
 *                squared L2 norm of the new v, computed while the block is in cache; given
 *                a threshold, the rank keys of the blocks at or above it (the candidates).
 *   top_blocks   the k blocks of largest norm: the pass's candidates when there are k to 4 k
 *                of them; else a threshold from a stratified sample of the
 *                norms (as DGC estimates its threshold from a sample), the blocks at or above
 *                it as candidates, then exactly the k largest among those; when the sample
 *                leaves fewer than k candidates, among all blocks. The result is always the
 *                exact top k (ties: the lower block index first); the sample only shrinks
 *                the set that is partially sorted.
 *   take         the selected blocks into rows or into the same blocks of the send array,
 *                and cleared in the residual (and velocity).
 *   unpack       the summed aligned array back into the bucket (divided by the ranks), and
 *                the blocks the sum wrote cleared, so the hook reuses one send array per bucket
 *                instead of zeroing a fresh one per call.
 *
 * The numpy definitions are in host_agent/compression/kernels.py; tests/test_compression.py
 * checks that both give identical bits. That is why the norm has a fixed summation order: 8
 * lanes, lane l summing the squares of elements l, l+8, l+16, ... in order, then
 * ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)); and why this file is built with -ffp-contract=off (no
 * fused multiply-add: every product and sum is rounded as numpy rounds it).
 * All four release the GIL.
 */
#include "../../spina/_pybuf.h"  /* Python.h, Buf, get_buf, release */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 8
#define MIN_SAMPLE_RANK 8  /* the sample's threshold rank is never below this: see top_blocks */

/* A buffer (get_buf) of items of one struct-module type code: 'f' (float32) or 'q' (int64;
 * numpy on LP64 says 'l'). */
static int get_typed(PyObject *obj, Buf *b, int writable, char type, const char *name) {
    if (get_buf(obj, b, writable, type == 'f' ? 4 : 8, name))
        return -1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    int ok = type == 'f' ? strcmp(f, "f") == 0 && b->view.itemsize == 4
                         : (strcmp(f, "q") == 0 || strcmp(f, "l") == 0) && b->view.itemsize == 8;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: needs %s items, got format '%s'", name,
                     type == 'f' ? "float32" : "int64", f);
        return -1;
    }
    return 0;
}

/* Parameter pieces (int64 src, dst, sizes, one item each per piece; their count into
 * *npieces): piece p is sizes[p] elements at src[p] of the bucket (n elements, `bucket` in
 * errors) and at dst[p] of the aligned array (length elements, `aligned`), dst[p] on a
 * block boundary, its blocks inside the aligned array and after the previous piece's (so
 * a pass meets every block once, in order, as BucketLayout lays them out). -1 with a ValueError naming `fn`. */
static int check_pieces(const char *fn, Buf *b, Py_ssize_t n, const char *bucket,
                        Py_ssize_t length, const char *aligned, Py_ssize_t bs,
                        Py_ssize_t *npieces) {
    Py_ssize_t np_ = *npieces = b[0].view.len / 8;
    const int64_t *src = b[0].view.buf, *dst = b[1].view.buf, *sizes = b[2].view.buf;
    if (b[1].view.len != 8 * np_ || b[2].view.len != 8 * np_) {
        PyErr_Format(PyExc_ValueError, "%s: src, dst and sizes differ in length", fn);
        return -1;
    }
    int64_t end = 0;  /* where the previous piece's blocks end */
    for (Py_ssize_t p = 0; p < np_; p++) {
        int64_t k = sizes[p], nb = (sizes[p] + bs - 1) / bs;
        if (k < 0 || src[p] < 0 || src[p] + k > n || dst[p] < end || dst[p] % bs
            || dst[p] + nb * bs > length) {
            PyErr_Format(PyExc_ValueError, "%s: piece %zd (src %lld, dst %lld, size %lld) "
                         "outside %s (%zd) or %s (%zd), dst not on a block boundary, or "
                         "before the previous piece's blocks end", fn, p, (long long)src[p],
                         (long long)dst[p], (long long)k, bucket, n, aligned, length);
            return -1;
        }
        end = dst[p] + nb * bs;
    }
    return 0;
}

/* ---- accumulate ---- */

/* A norm's sort key: its bits without the sign (a non-negative float orders like its bits),
 * every NaN as one value above +inf (NaN blocks are sent first, as numpy sorts NaN last). */
static inline uint32_t norm_key(float x) {
    uint32_t k;
    memcpy(&k, &x, 4);
    k &= 0x7FFFFFFFu;
    return k > 0x7F800000u ? 0x7FC00000u : k;
}


/* One block: `count` elements of the bucket x (the rest of the block is padding, read but
 * not written), optionally through the velocity u, added into v; returns the block's
 * squared norm in the lane order above. */
#define BLOCK_BODY                                                                          \
    float acc[LANES] = {0};                                                                 \
    Py_ssize_t j = 0;                                                                       \
    if (u) {                                                                                \
        for (; j + LANES <= count; j += LANES)                                              \
            for (int l = 0; l < LANES; l++) {                                               \
                float w = m * u[j + l] + x[j + l];                                          \
                u[j + l] = w;                                                               \
                float s = v[j + l] + w;                                                     \
                v[j + l] = s;                                                               \
                acc[l] += s * s;                                                            \
            }                                                                               \
        for (Py_ssize_t t = j; t < count; t++) {                                            \
            float w = m * u[t] + x[t];                                                      \
            u[t] = w;                                                                       \
            v[t] += w;                                                                      \
        }                                                                                   \
    } else {                                                                                \
        for (; j + LANES <= count; j += LANES)                                              \
            for (int l = 0; l < LANES; l++) {                                               \
                float s = v[j + l] + x[j + l];                                              \
                v[j + l] = s;                                                               \
                acc[l] += s * s;                                                            \
            }                                                                               \
        for (Py_ssize_t t = j; t < count; t++)                                              \
            v[t] += x[t];                                                                   \
    }                                                                                       \
    /* from the first partial group on (its rest and the padding): each lane in order */    \
    for (Py_ssize_t t = j; t < bs; t += LANES)                                              \
        for (int l = 0; l < LANES && t + l < bs; l++)                                       \
            acc[l] += v[t + l] * v[t + l];                                                  \
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_VARIANT 1
__attribute__((target("avx2")))
static float block_avx2(float *restrict v, float *restrict u, const float *restrict x,
                        Py_ssize_t count, Py_ssize_t bs, float m) {
    BLOCK_BODY
}
#endif
static float block_generic(float *restrict v, float *restrict u, const float *restrict x,
                           Py_ssize_t count, Py_ssize_t bs, float m) {
    BLOCK_BODY
}
static float (*block_pass)(float *, float *, const float *, Py_ssize_t, Py_ssize_t, float) =
    block_generic;

PyDoc_STRVAR(accumulate_doc,
"accumulate(grad, src, dst, sizes, block_size, v, u, momentum, norms, threshold, cand)\n"
"    -> count\n\n"
"For each parameter p (int64 arrays src, dst, sizes): its sizes[p] float32 elements of\n"
"`grad` starting at src[p] go to the block-aligned offset dst[p] (a multiple of block_size):\n"
"u = momentum * u + g, x = u if u is not None else x = g; then v += x. norms[b] (float32, one\n"
"per block of v) becomes the squared L2 norm of block b of the new v, for every block that\n"
"a parameter covers (ceil(sizes[p] / block_size) blocks from dst[p]), in the lane order of\n"
"host_agent/compression/kernels.py. With threshold >= 0 (a norm key, kernels.norm_keys), every\n"
"block whose new norm's key is >= threshold is appended to cand (int64, one item per block)\n"
"in the order the pass meets it, as its rank key (key << 32 | 0xFFFFFFFF - block), and\n"
"count is their number (else 0, cand unused): the selection's candidates, found while each\n"
"norm is in a register. Releases the GIL.");

static PyObject *accumulate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[8] = {0};
    PyObject *result = NULL;
    if (!nargs_is("accumulate", nargs, 11))
        return NULL;
    Py_ssize_t bs;
    if (block_size_arg(args[4], "accumulate", &bs) < 0)
        return NULL;
    double m = PyFloat_AsDouble(args[7]);
    if (m == -1.0 && PyErr_Occurred())
        return NULL;
    long long threshold = PyLong_AsLongLong(args[9]);
    if (threshold == -1 && PyErr_Occurred())
        return NULL;
    if (threshold > 0x7FC00000ll || (threshold < 0 && threshold != -1)) {
        PyErr_SetString(PyExc_ValueError, "accumulate: threshold is a norm key (0 to "
                        "0x7FC00000) or -1 (none)");
        return NULL;
    }
    if (get_typed(args[0], &b[0], 0, 'f', "grad") || get_typed(args[1], &b[1], 0, 'q', "src")
        || get_typed(args[2], &b[2], 0, 'q', "dst") || get_typed(args[3], &b[3], 0, 'q', "sizes")
        || get_typed(args[5], &b[4], 1, 'f', "v")
        || (args[6] != Py_None && get_typed(args[6], &b[5], 1, 'f', "u"))
        || get_typed(args[8], &b[6], 1, 'f', "norms")
        || (threshold >= 0 && get_typed(args[10], &b[7], 1, 'q', "cand")))
        goto done;
    Py_ssize_t n = b[0].view.len / 4, length = b[4].view.len / 4, npieces;
    const int64_t *src = b[1].view.buf, *dst = b[2].view.buf, *sizes = b[3].view.buf;
    if (length % bs || length / bs > 0xFFFFFFFFll || b[6].view.len / 4 != length / bs
        || (b[5].held && b[5].view.len / 4 != length)
        || (b[7].held && b[7].view.len / 8 != length / bs)) {
        PyErr_Format(PyExc_ValueError, "accumulate: v (and u) need whole blocks, norms (and "
                     "cand) one item per block (%zd elements, block_size %zd)", length, bs);
        goto done;
    }
    if (check_pieces("accumulate", &b[1], n, "grad", length, "v", bs, &npieces))
        goto done;
    const float *g = b[0].view.buf;
    float *v = b[4].view.buf, *norms = b[6].view.buf;
    float *u = b[5].held ? (float *)b[5].view.buf : NULL;
    float mf = (float)m;
    int64_t *cand = b[7].held ? (int64_t *)b[7].view.buf : NULL;
    uint32_t thr = threshold >= 0 ? (uint32_t)threshold : 0;
    Py_ssize_t ncand = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < npieces; p++)
        for (int64_t off = 0; off < sizes[p]; off += bs) {
            Py_ssize_t count = sizes[p] - off < bs ? (Py_ssize_t)(sizes[p] - off) : bs;
            Py_ssize_t at = (Py_ssize_t)(dst[p] + off);
            float norm = block_pass(v + at, u ? u + at : NULL, g + src[p] + off, count, bs, mf);
            norms[at / bs] = norm;
            uint32_t key = norm_key(norm);
            if (cand && key >= thr)  /* its rank key (top_blocks): needs no norm read again */
                cand[ncand++] = (int64_t)(((uint64_t)key << 32) | (0xFFFFFFFFu - (uint32_t)(at / bs)));
        }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(ncand);
done:
    release(b, 8);
    return result;
}

/* ---- top_blocks ---- */

static inline uint64_t splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline void swap64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Rearrange a[0..n) so that a[k] holds the (k+1)-th largest value, a[0..k) values >= it and
 * a[k+1..n) values <= it (quickselect, three-way partitions: equal values cost nothing). */
static void nth_largest(uint64_t *a, size_t n, size_t k) {
    size_t lo = 0, hi = n;
    uint64_t state = 0x2545F4914F6CDD1Dull ^ n;
    while (hi - lo > 1) {
        size_t len = hi - lo;
        uint64_t p0 = a[lo + splitmix64(state += 0x9E3779B97F4A7C15ull) % len];
        uint64_t p1 = a[lo + splitmix64(state += 0x9E3779B97F4A7C15ull) % len];
        uint64_t p2 = a[lo + splitmix64(state += 0x9E3779B97F4A7C15ull) % len];
        uint64_t pivot = p0 > p1 ? (p1 > p2 ? p1 : (p0 > p2 ? p2 : p0))
                                 : (p0 > p2 ? p0 : (p1 > p2 ? p2 : p1));  /* median of three */
        size_t lt = lo, i = lo, gt = hi;  /* [lo,lt) > pivot, [lt,i) == pivot, [gt,hi) < pivot */
        while (i < gt) {
            if (a[i] > pivot)
                swap64(&a[lt++], &a[i++]);
            else if (a[i] < pivot)
                swap64(&a[i], &a[--gt]);
            else
                i++;
        }
        if (k < lt)
            hi = lt;
        else if (k >= gt)
            lo = gt;
        else
            return;
    }
}

/* The composite key: norm key, then the lower block index first; unique per block. */
static inline uint64_t rank_key(const float *norms, int64_t b) {
    return ((uint64_t)norm_key(norms[b]) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)b);
}

PyDoc_STRVAR(top_blocks_doc,
"top_blocks(norms, k, nsample, seed, out, given, given_threshold)\n"
"    -> (count, candidates, threshold)\n\n"
"The sorted indices of the k blocks with the largest norms (float32 `norms`; ties: the lower\n"
"index first; NaN above +inf) into out[:count] (int64, at least len(norms) items: it also\n"
"holds the candidates); count = min(k, len(norms)). With 0 < nsample < len(norms) and\n"
"k <= len(norms) / 2, the norms of nsample blocks (one drawn from each of nsample equal\n"
"strata by `seed`) give a threshold, their r-th largest key, r = max(8, ceil(2 k nsample /\n"
"n)); blocks with a key >= threshold are the candidates, and the k largest are chosen among\n"
"them. Fewer than k candidates, or no sample: among all blocks (candidates = n, threshold\n"
"-1). The keys: kernels.norm_keys. given >= 0: out[:given] already holds the rank keys of\n"
"the blocks whose key is >= given_threshold, in increasing block order (accumulate's cand,\n"
"so no norm is read for them); with k <= given <=\n"
"4 k and 2 given <= n they are the candidates and no sample is drawn (threshold =\n"
"given_threshold), else a sample is drawn as above. The result is the same either way.\n"
"Releases the GIL.");

static PyObject *top_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[2] = {0};
    PyObject *result = NULL;
    if (!nargs_is("top_blocks", nargs, 7))
        return NULL;
    Py_ssize_t k = PyLong_AsSsize_t(args[1]), nsample = PyLong_AsSsize_t(args[2]);
    uint64_t seed = PyLong_AsUnsignedLongLongMask(args[3]);
    Py_ssize_t given = PyLong_AsSsize_t(args[5]);
    long long given_thr = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (get_typed(args[0], &b[0], 0, 'f', "norms") || get_typed(args[4], &b[1], 1, 'q', "out"))
        goto done;
    Py_ssize_t n = b[0].view.len / 4;
    if (k < 0 || n > 0xFFFFFFFFll || b[1].view.len / 8 < n || given > n
        || (given >= 0 && (given_thr < 0 || given_thr > 0x7FC00000ll))) {
        PyErr_Format(PyExc_ValueError, "top_blocks: k >= 0, at most 2**32 - 1 blocks, out "
                     "needs %zd items, given at most as many, given_threshold a norm key", n);
        goto done;
    }
    const float *norms = b[0].view.buf;
    int64_t *out = b[1].view.buf;
    if (k == 0 || k >= n) {
        k = k < n ? k : n;
        for (Py_ssize_t i = 0; i < k; i++)
            out[i] = i;
        result = Py_BuildValue("nnL", k, n, -1LL);
        goto done;
    }
    /* the pass's candidates: no sample, no scan of the norms (which the pass has pushed out
     * of the caches); 4 k at most, or the quickselect among them costs more than a sample */
    int reuse = given >= k && given <= 4 * k && 2 * given <= n;
    int sampled = !reuse && nsample > 0 && nsample < n && 2 * k <= n;
    Py_ssize_t r = 0, ncand = reuse ? given : n;
    if (sampled) {
        r = (2 * k * nsample + n - 1) / n;
        r = r < MIN_SAMPLE_RANK ? MIN_SAMPLE_RANK : r;
        sampled = r <= nsample;
    }
    /* No scratch memory: `out` is the workspace (the sample, then the candidates and their
     * rank keys behind them). A fresh n-sized buffer would be mapped anew by every call, and
     * the page faults cost more than the selection (8 ms against 1 ms for 400,000 blocks). */
    uint64_t *work = (uint64_t *)out;
    for (Py_ssize_t i = 0; reuse && i < given; i++) {  /* rank keys as accumulate writes them */
        uint64_t rk = (uint64_t)out[i], prev = i ? (uint64_t)out[i - 1] : 0;
        int64_t blk = 0xFFFFFFFFu - (uint32_t)rk;
        if (blk >= n || (i && blk <= (int64_t)(0xFFFFFFFFu - (uint32_t)prev))
            || (rk >> 32) < (uint64_t)given_thr || (rk >> 32) > 0x7FC00000u) {
            PyErr_Format(PyExc_ValueError, "top_blocks: given candidate %zd (block %lld) not "
                         "increasing, outside the %zd blocks, or its key not in [given_threshold,"
                         " NaN]", i, (long long)blk, n);
            goto done;
        }
    }
    long long threshold = reuse ? given_thr : -1;
    Py_BEGIN_ALLOW_THREADS
    if (sampled) {
        for (Py_ssize_t i = 0; i < nsample; i++) {  /* one block from each stratum */
            uint64_t lo = (uint64_t)i * n / nsample, hi = (uint64_t)(i + 1) * n / nsample;
            uint64_t z = splitmix64(seed + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull);
            /* a multiply, not z % (hi - lo): a 64-bit division took a fifth of the call */
            work[i] = norm_key(norms[lo + (((z >> 32) * (hi - lo)) >> 32)]);
        }
        nth_largest(work, (size_t)nsample, (size_t)(r - 1));
        uint32_t thr = (uint32_t)work[r - 1];
        ncand = 0;  /* overwrites the sample, which is done with */
        for (Py_ssize_t i = 0; i < n; i++) {  /* without a branch: the scan was half the call */
            out[ncand] = i;
            ncand += norm_key(norms[i]) >= thr;
        }
        if (ncand >= k)
            threshold = thr;
        else
            ncand = n;  /* the sample overestimated: choose among all */
    }
    if (ncand > k && 2 * ncand <= n) {  /* among the candidates, rank keys behind them */
        for (Py_ssize_t i = 0; i < ncand; i++)
            work[ncand + i] = reuse ? (uint64_t)out[i] : rank_key(norms, out[i]);
        nth_largest(work + ncand, (size_t)ncand, (size_t)(k - 1));
        uint64_t kth = work[ncand + k - 1];
        Py_ssize_t w = 0;
        for (Py_ssize_t i = 0; i < ncand; i++)  /* w <= i: out[i] is read before it is written */
            if (reuse ? (uint64_t)out[i] >= kth : rank_key(norms, out[i]) >= kth)
                out[w++] = reuse ? 0xFFFFFFFFu - (uint32_t)out[i] : out[i];
    } else if (reuse) {  /* exactly k candidates: all of them, rank keys back to blocks */
        for (Py_ssize_t i = 0; i < k; i++)
            out[i] = 0xFFFFFFFFu - (uint32_t)out[i];
    } else if (ncand > k) {  /* among all blocks: the same k, as every one of them is a candidate */
        for (Py_ssize_t i = 0; i < n; i++)
            work[i] = rank_key(norms, i);
        nth_largest(work, (size_t)n, (size_t)(k - 1));
        uint64_t kth = work[k - 1];
        Py_ssize_t w = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (rank_key(norms, i) >= kth)
                out[w++] = i;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("nnL", k, ncand, threshold);
done:
    release(b, 2);
    return result;
}

/* ---- take ---- */

PyDoc_STRVAR(take_doc,
"take(v, blocks, block_size, dest, in_place, clear, u) -> None\n\n"
"Block blocks[i] of v (float32 v, int64 blocks) copied into dest (float32): into row i of\n"
"dest as len(blocks) x block_size rows, or with `in_place` into the same block of dest, an\n"
"array as long as v (the hook's send array: no rows in between). With `clear` those blocks\n"
"of v become +0.0, and of u (float32, or None) too: the selection's copy and the error\n"
"feedback's and DGC masking's clearing in one call (numpy's v2d[blocks], v2d[blocks] = 0,\n"
"u2d[blocks] = 0). Releases the GIL.");

static PyObject *take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[4] = {0};
    PyObject *result = NULL;
    if (!nargs_is("take", nargs, 7))
        return NULL;
    Py_ssize_t bs;
    if (block_size_arg(args[2], "take", &bs) < 0)
        return NULL;
    int in_place = PyObject_IsTrue(args[4]), clear = PyObject_IsTrue(args[5]);
    if (in_place < 0 || clear < 0)
        return NULL;
    if (get_typed(args[0], &b[0], clear, 'f', "v") || get_typed(args[1], &b[1], 0, 'q', "blocks")
        || get_typed(args[3], &b[2], 1, 'f', "dest")
        || (args[6] != Py_None && get_typed(args[6], &b[3], 1, 'f', "u")))
        goto done;
    Py_ssize_t nb = b[0].view.len / 4 / bs, k = b[1].view.len / 8;
    const int64_t *blocks = b[1].view.buf;
    if (b[2].view.len != (in_place ? b[0].view.len : k * bs * 4)
        || (b[3].held && b[3].view.len != b[0].view.len)) {
        PyErr_Format(PyExc_ValueError, "take: dest needs %zd items (%s), u as many as v",
                     in_place ? b[0].view.len / 4 : k * bs, in_place ? "as v" : "the rows");
        goto done;
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (blocks[i] < 0 || blocks[i] >= nb) {
            PyErr_Format(PyExc_ValueError, "take: block %lld outside v's %zd blocks",
                         (long long)blocks[i], nb);
            goto done;
        }
    float *v = b[0].view.buf, *dest = b[2].view.buf, *u = b[3].held ? b[3].view.buf : NULL;
    size_t bytes = (size_t)bs * 4;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        float *at = v + blocks[i] * bs;
        memcpy(dest + (in_place ? blocks[i] : i) * bs, at, bytes);
        if (clear)
            memset(at, 0, bytes);
        if (u)
            memset(u + blocks[i] * bs, 0, bytes);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release(b, 4);
    return result;
}

/* ---- unpack ---- */

PyDoc_STRVAR(unpack_doc,
"unpack(res, src, dst, sizes, block_size, out, divisor) -> None\n\n"
"The summed aligned array `res` (float32) back into the bucket `out` (float32), piece by\n"
"piece: out[src[p] + i] = res[dst[p] + i] / divisor for i < sizes[p] (float32 division,\n"
"correctly rounded; divisor 1 copies the bits), the inverse of accumulate's layout. Every\n"
"block of res that a piece covers and that holds a non-zero bit (NaN, -0.0, a sum) becomes\n"
"+0.0, so that res, zero outside those blocks, is all zeros again for the next call: the\n"
"compressed hook reuses one send array per bucket and clears only what the sum wrote, in\n"
"the pass that reads it anyway. Releases the GIL.");

static PyObject *unpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[5] = {0};
    PyObject *result = NULL;
    if (!nargs_is("unpack", nargs, 7))
        return NULL;
    Py_ssize_t bs;
    if (block_size_arg(args[4], "unpack", &bs) < 0)
        return NULL;
    long divisor = PyLong_AsLong(args[6]);
    if (divisor == -1 && PyErr_Occurred())
        return NULL;
    if (divisor < 1) {
        PyErr_SetString(PyExc_ValueError, "unpack: divisor >= 1");
        return NULL;
    }
    if (get_typed(args[0], &b[0], 1, 'f', "res") || get_typed(args[1], &b[1], 0, 'q', "src")
        || get_typed(args[2], &b[2], 0, 'q', "dst") || get_typed(args[3], &b[3], 0, 'q', "sizes")
        || get_typed(args[5], &b[4], 1, 'f', "out"))
        goto done;
    Py_ssize_t length = b[0].view.len / 4, n = b[4].view.len / 4, npieces;
    const int64_t *src = b[1].view.buf, *dst = b[2].view.buf, *sizes = b[3].view.buf;
    if (check_pieces("unpack", &b[1], n, "out", length, "res", bs, &npieces))
        goto done;
    float *res = b[0].view.buf, *out = b[4].view.buf;
    /* A power of two's reciprocal is exact, and x * (1/d) and x / d are then the same
     * correctly rounded value (subnormals too): the multiply is the faster one. */
    int pow2 = (divisor & (divisor - 1)) == 0;
    float d = (float)divisor, inv = 1.0f / d;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < npieces; p++)
        for (int64_t off = 0; off < sizes[p]; off += bs) {
            Py_ssize_t count = sizes[p] - off < bs ? (Py_ssize_t)(sizes[p] - off) : bs;
            float *r = res + dst[p] + off, *o = out + src[p] + off;
            uint32_t any = 0;  /* the block's bits or'ed: zero only if all of it is +0.0 */
            for (Py_ssize_t i = 0; i < count; i++) {
                uint32_t bits;
                memcpy(&bits, &r[i], 4);
                any |= bits;
            }
            if (!any) {  /* most blocks: nobody sent them */
                memset(o, 0, (size_t)count * 4);
            } else {
                if (divisor == 1)
                    memcpy(o, r, (size_t)count * 4);
                else if (pow2)
                    for (Py_ssize_t i = 0; i < count; i++)
                        o[i] = r[i] * inv;
                else
                    for (Py_ssize_t i = 0; i < count; i++)
                        o[i] = r[i] / d;
            }
            for (Py_ssize_t i = count; i < bs; i++) {  /* padding: a NaN block's is NaN */
                uint32_t bits;
                memcpy(&bits, &r[i], 4);
                any |= bits;
            }
            if (any)
                memset(r, 0, (size_t)bs * 4);
        }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release(b, 5);
    return result;
}

/* ---- the module ---- */

PyDoc_STRVAR(set_variant_doc,
"set_variant(name) -> None\n\n"
"Use the 'generic' or the 'avx2' build of accumulate's block loop (tests compare both);\n"
"VARIANT names the one in use (chosen at import: avx2 where the CPU has it).");

static PyObject *set_variant(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (name && strcmp(name, "generic") == 0) {
        block_pass = block_generic;
#ifdef HAVE_AVX2_VARIANT
    } else if (name && strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        block_pass = block_avx2;
#endif
    } else {
        PyErr_Format(PyExc_ValueError, "variant %R: 'generic', or 'avx2' on a CPU that has it",
                     arg);
        return NULL;
    }
    if (PyModule_AddStringConstant(self, "VARIANT", name) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_variant", set_variant, METH_O, set_variant_doc},
    {"accumulate", (PyCFunction)(void (*)(void))accumulate, METH_FASTCALL, accumulate_doc},
    {"top_blocks", (PyCFunction)(void (*)(void))top_blocks, METH_FASTCALL, top_blocks_doc},
    {"take", (PyCFunction)(void (*)(void))take, METH_FASTCALL, take_doc},
    {"unpack", (PyCFunction)(void (*)(void))unpack, METH_FASTCALL, unpack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "host_agent.compression._kernels",
    "The compressor's per-bucket pass and block selection, compiled "
    "(host_agent/compression/_kernels.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__kernels(void) {
#ifdef HAVE_AVX2_VARIANT
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2"))
        block_pass = block_avx2;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "VARIANT", block_pass == block_generic
                                        ? "generic" : "avx2") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
