/* The host agent's per-datagram data work, compiled (issue 12, item 2).
 *
 * Two steps, one C call each per datagram, each reading and writing every byte once:
 *
 *   fill_round  a contribution's body: per lane, is this worker's next own block the round's
 *               agreed position? then gather it from the tensor (the partial last block
 *               zero-padded, NaN/Inf as 0 in a block reported non-finite), quantize
 *               (x * 2**shift, rounded half to even) and store big-endian into the datagram;
 *               the lane's next own position after it goes into `next`.
 *   deliver     a result's body: dequantize each present lane's int32 sum (to float32, then
 *               * 2**-shift) and write it to its block of the output; NaN into the blocks a
 *               worker reported non-finite.
 *
 * The header is packed by the agent (struct), so a packet's priority and flags stay a Python
 * decision. The numpy forms in host_agent/blocks.py (quantize, dequantize, gather_blocks,
 * scatter_blocks) are the reference: tests/test_core.py checks both give identical bytes.
 * Layout of a datagram: spina/wire.py (48-byte header, nlanes u32 `next`, present rows).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define HEADER_LEN 48
#define MAX_LANES 64
#define END_POS 0xFFFFFFFFu

static inline void store_be32(unsigned char *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}

static inline uint32_t load_be32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
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

typedef struct {
    Py_buffer view;
    int held;
} Buf;

static int get_buf(PyObject *obj, Buf *b, int writable, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    b->held = 1;
    if (itemsize && b->view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     name, b->view.len, itemsize);
        return -1;
    }
    return 0;
}

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].view);
}

PyDoc_STRVAR(fill_round_doc,
"fill_round(datagram, flat, pos_ext, ptr, pos, nonfinite, lane0, shift, integer, block_size)\n"
"    -> (present, nonfinite_bits, nrows, last)\n\n"
"Write one contribution's `next` positions and data rows into `datagram` (after its header).\n"
"flat: the tensor (float32, or int32 if integer); pos_ext: int64 plan positions lane by lane,\n"
"each lane followed by the sentinel -1; ptr: int64 per lane, index into pos_ext of the lane's\n"
"first block not yet sent (advanced in place past the blocks sent now); pos: int64 per lane,\n"
"the round's agreed positions; nonfinite: None or uint8 per plan row (row = pos_ext index -\n"
"lane), 1 where the block holds NaN/Inf; lane0: the slot's first global lane. Returns the\n"
"present lane bitmap, the non-finite lane bitmap, the number of rows written, and whether\n"
"every lane's next position is END (nothing more to send).");

static PyObject *fill_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[6];
    memset(b, 0, sizeof b);
    PyObject *result = NULL;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "fill_round takes 10 arguments");
        return NULL;
    }
    long long lane0 = PyLong_AsLongLong(args[6]);
    long shift = PyLong_AsLong(args[7]);
    int integer = PyObject_IsTrue(args[8]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[9]);
    if (PyErr_Occurred() || integer < 0)
        return NULL;
    if (get_buf(args[0], &b[0], 1, 0, "datagram") || get_buf(args[1], &b[1], 0, 4, "flat")
        || get_buf(args[2], &b[2], 0, 8, "pos_ext") || get_buf(args[3], &b[3], 1, 8, "ptr")
        || get_buf(args[4], &b[4], 0, 8, "pos")
        || (args[5] != Py_None && get_buf(args[5], &b[5], 0, 1, "nonfinite")))
        goto done;
    Py_ssize_t k = b[3].view.len / 8, n = b[1].view.len / 4, m = b[2].view.len / 8;
    Py_ssize_t nf_len = b[5].held ? b[5].view.len : 0;
    if (k < 1 || k > MAX_LANES || b[4].view.len != 8 * k || bs < 1) {
        PyErr_SetString(PyExc_ValueError, "fill_round: ptr and pos need 1..64 lanes each, block_size >= 1");
        goto done;
    }
    Py_ssize_t data_at = HEADER_LEN + 4 * k;
    if (b[0].view.len < data_at + 4 * k * bs) {
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
    const int64_t *pos = (const int64_t *)b[4].view.buf;
    const unsigned char *nonfinite = b[5].held ? (const unsigned char *)b[5].view.buf : NULL;
    float factor = pow2_f32((int)shift);
    uint64_t present = 0, nf_bits = 0;
    Py_ssize_t nrows = 0;
    int last = 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t p = ptr[i];
        if (p < 0 || p >= m) {
            PyErr_Format(PyExc_IndexError, "fill_round: ptr[%zd] = %lld outside pos_ext", i, (long long)p);
            goto done;
        }
        int64_t own = pos_ext[p];
        if (own >= 0 && own == pos[i]) {
            if (own * bs >= n) {
                PyErr_Format(PyExc_IndexError, "fill_round: block %lld outside the tensor", (long long)own);
                goto done;
            }
            int finite_only = 0;
            if (nonfinite) {
                int64_t row = p - (lane0 + i);
                if (row < 0 || row >= nf_len) {
                    PyErr_Format(PyExc_IndexError, "fill_round: plan row %lld outside nonfinite", (long long)row);
                    goto done;
                }
                finite_only = nonfinite[row] != 0;
            }
            Py_ssize_t start = (Py_ssize_t)own * bs;
            Py_ssize_t count = n - start < bs ? n - start : bs;
            quantize_row(dgram + data_at + 4 * bs * nrows, flat + 4 * start, count, bs, integer,
                         finite_only, (int)shift, factor);
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
    result = Py_BuildValue("(KKnO)", (unsigned long long)present, (unsigned long long)nf_bits,
                           nrows, last ? Py_True : Py_False);
done:
    release(b, 6);
    return result;
}

PyDoc_STRVAR(deliver_doc,
"deliver(datagram, out, pos, present, nonfinite, shift, integer, block_size)\n\n"
"Write a result's rows into `out` (float32, or int32 if integer): the i-th present lane's row\n"
"goes to block pos[i] (int64 per lane), dequantized by 2**-shift (floats); blocks of the\n"
"`nonfinite` lanes become NaN. Only the first elements of the partial last block are written.");

static PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[3];
    memset(b, 0, sizeof b);
    PyObject *result = NULL;
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "deliver takes 8 arguments");
        return NULL;
    }
    unsigned long long present = PyLong_AsUnsignedLongLong(args[3]);
    unsigned long long nf_bits = PyLong_AsUnsignedLongLong(args[4]);
    long shift = PyLong_AsLong(args[5]);
    int integer = PyObject_IsTrue(args[6]);
    Py_ssize_t bs = PyLong_AsSsize_t(args[7]);
    if (PyErr_Occurred() || integer < 0)
        return NULL;
    if (get_buf(args[0], &b[0], 0, 0, "datagram") || get_buf(args[1], &b[1], 1, 4, "out")
        || get_buf(args[2], &b[2], 0, 8, "pos"))
        goto done;
    Py_ssize_t k = b[2].view.len / 8, n = b[1].view.len / 4;
    if (k < 1 || k > MAX_LANES || bs < 1 || (k < 64 && ((present | nf_bits) >> k))) {
        PyErr_SetString(PyExc_ValueError, "deliver: 1..64 lanes, lane bits within them, block_size >= 1");
        goto done;
    }
    Py_ssize_t data_at = HEADER_LEN + 4 * k;
    if (b[0].view.len < data_at + 4 * bs * __builtin_popcountll(present)) {
        PyErr_SetString(PyExc_ValueError, "deliver: datagram shorter than its present rows");
        goto done;
    }
    if (shift < -100000 || shift > 100000) {
        PyErr_SetString(PyExc_ValueError, "deliver: shift out of range");
        goto done;
    }
    const unsigned char *dgram = (const unsigned char *)b[0].view.buf;
    char *out = (char *)b[1].view.buf;
    const int64_t *pos = (const int64_t *)b[2].view.buf;
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
        const unsigned char *src = dgram + data_at + 4 * bs * row++;
        if (integer) {
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
    Py_INCREF(Py_None);
    result = Py_None;
done:
    release(b, 3);
    return result;
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
#ifdef HAVE_AVX2_VARIANT
    } else if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("avx2")) {
        quantize_scaled = quantize_avx2;
        dequantize_scaled = dequantize_avx2;
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
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddStringConstant(m, "VARIANT", quantize_scaled == quantize_generic
                                        ? "generic" : "avx2") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
