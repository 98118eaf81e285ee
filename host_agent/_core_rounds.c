/* The rounds of the host agent's compiled core, one C call per datagram and direction, each
 * reading and writing every byte once (the twins of host_agent/agent.py's _Call rounds, its
 * narrow rows those of host_agent/narrow.py's NumpyRounds; tests/test_core.py and
 * tests/test_narrow_lanes.py check both give identical bytes):
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
 * Layout of a datagram: spina/wire.py (48-byte header, nlanes u32 `next`, present rows).
 */
#include "_core.h"
#include <math.h>

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
"block_size on (blocks.rounding_noise), as narrow.NumpyRounds.fill does; `residual` (None, or\n"
"float32 of flat's size) then takes each sent block's error (error feedback). The rows are\n"
"written without the GIL.");

/* fill_round's scalar arguments, parsed and checked. */
typedef struct {
    long long lane0;
    long shift, flags, priority, exponent;
    unsigned long round_;
    Py_ssize_t bs;
    int integer, setup, item, narrow;
    Draws dr;
    PyObject *residual;  /* Py_None: no error feedback */
} FillArgs;

/* 0, or -1 with an exception naming what is wrong. */
static int fill_args(PyObject *const *args, Py_ssize_t nargs, FillArgs *fa) {
    if (nargs != 14 && nargs != 16) {
        PyErr_Format(PyExc_TypeError, "fill_round takes 14 or 16 arguments (%zd given)", nargs);
        return -1;
    }
    fa->lane0 = PyLong_AsLongLong(args[6]);
    fa->shift = PyLong_AsLong(args[7]);
    fa->integer = PyObject_IsTrue(args[8]);
    fa->bs = PyLong_AsSsize_t(args[9]);
    fa->round_ = PyLong_AsUnsignedLong(args[10]);
    fa->flags = PyLong_AsLong(args[11]);
    fa->priority = PyLong_AsLong(args[12]);
    fa->exponent = PyLong_AsLong(args[13]);
    PyObject *draws_obj = nargs == 16 ? args[14] : Py_None;
    fa->residual = nargs == 16 ? args[15] : Py_None;
    unsigned long long seed = 0, rank = 0, step = 0;
    if (PyErr_Occurred() || fa->integer < 0
        || (draws_obj != Py_None && !PyArg_ParseTuple(draws_obj, "KKK", &seed, &rank, &step)))
        return -1;
    fa->dr = draws_for(seed, rank, step);
    if (fa->round_ > 0xFFFFFFFFul || fa->flags < 0 || fa->flags > 255 || fa->priority < 0
        || fa->priority > 255 || fa->exponent < -32768 || fa->exponent > 32767) {
        PyErr_SetString(PyExc_ValueError, "fill_round: round, flags, priority or exponent outside its field");
        return -1;
    }
    fa->setup = args[4] == Py_None;
    fa->item = LANE_ITEM_BYTES(fa->flags);
    fa->narrow = fa->item < 4;
    if (!fa->item || (fa->narrow && fa->integer) || (fa->narrow && !fa->setup && draws_obj == Py_None)
        || (fa->residual != Py_None && !fa->narrow)) {
        PyErr_SetString(PyExc_ValueError, "fill_round: one lane width; narrow lanes for float "
                        "tensors, with draws; a residual only with narrow lanes");
        return -1;
    }
    return 0;
}

/* The round's plan: which lanes send which block (every index checked), each lane's `next`
 * written into the datagram and its ptr advanced past the block it sends. */
typedef struct {
    RowJob jobs[MAX_LANES];
    Py_ssize_t nrows;
    uint64_t present, nf_bits;
    int last;
} RoundPlan;

/* 0, or -1 with an IndexError naming the index outside its array. */
static int plan_round(RoundPlan *pl, unsigned char *dgram, const FillArgs *fa, Buf *b) {
    Py_ssize_t k = b[3].view.len / 8, n = b[1].view.len / 4, m = b[2].view.len / 8;
    Py_ssize_t nf_len = b[5].held ? b[5].view.len : 0, bs = fa->bs;
    const int64_t *pos_ext = (const int64_t *)b[2].view.buf;
    int64_t *ptr = (int64_t *)b[3].view.buf;
    const int64_t *pos = fa->setup ? NULL : (const int64_t *)b[4].view.buf;
    const unsigned char *nonfinite = b[5].held ? (const unsigned char *)b[5].view.buf : NULL;
    pl->nrows = 0;
    pl->present = pl->nf_bits = 0;
    pl->last = 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        int64_t p = ptr[i];
        if (p < 0 || p >= m) {
            PyErr_Format(PyExc_IndexError, "fill_round: ptr[%zd] = %lld outside pos_ext", i, (long long)p);
            return -1;
        }
        int64_t own = pos_ext[p];
        if (pos && own >= 0 && own == pos[i]) {
            if (own * bs >= n) {
                PyErr_Format(PyExc_IndexError, "fill_round: block %lld outside the tensor", (long long)own);
                return -1;
            }
            int64_t row = p - (fa->lane0 + i);
            int finite_only = 0;
            if (nonfinite) {
                if (row < 0 || row >= nf_len) {
                    PyErr_Format(PyExc_IndexError, "fill_round: plan row %lld outside nonfinite", (long long)row);
                    return -1;
                }
                finite_only = nonfinite[row] != 0;
            }
            Py_ssize_t start = (Py_ssize_t)own * bs;
            pl->jobs[pl->nrows++] = (RowJob){start, n - start < bs ? n - start : bs, row, finite_only};
            pl->present |= 1ull << i;
            if (finite_only)
                pl->nf_bits |= 1ull << i;
            p = ++ptr[i];
            if (p >= m) {
                PyErr_SetString(PyExc_IndexError, "fill_round: a lane has no sentinel in pos_ext");
                return -1;
            }
        }
        int64_t next = pos_ext[p];
        store_be32(dgram + HEADER_LEN + 4 * i, next < 0 ? END_POS : (uint32_t)next);
        pl->last &= next < 0;
    }
    for (Py_ssize_t r = 0; fa->narrow && r < pl->nrows; r++)
        if (pl->jobs[r].row < 0) {
            PyErr_Format(PyExc_IndexError, "fill_round: plan row %lld < 0", (long long)pl->jobs[r].row);
            return -1;
        }
    return 0;
}

/* The plan's rows into the datagram from data_at on: narrow ones without the GIL (the draws
 * make a narrow row cost several times an int32 one). */
static void write_rows(unsigned char *rows, const RoundPlan *pl, const FillArgs *fa,
                       const char *flat, float *residual) {
    if (fa->narrow) {
        Py_BEGIN_ALLOW_THREADS
        narrow_rows(rows, fa->item, (const float *)flat, pl->jobs, pl->nrows, fa->bs,
                    (int)fa->shift, &fa->dr, residual);
        Py_END_ALLOW_THREADS
    } else {
        quantize_rows(rows, flat, pl->jobs, pl->nrows, fa->bs, fa->integer, (int)fa->shift);
    }
}

PyObject *fill_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Buf b[7] = {0};
    PyObject *result = NULL;
    FillArgs fa;
    if (fill_args(args, nargs, &fa))
        return NULL;
    if (get_buf(args[0], &b[0], 1, 0, "datagram") || get_buf(args[1], &b[1], 0, 4, "flat")
        || get_buf(args[2], &b[2], 0, 8, "pos_ext") || get_buf(args[3], &b[3], 1, 8, "ptr")
        || (!fa.setup && get_buf(args[4], &b[4], 0, 8, "pos"))
        || (args[5] != Py_None && get_buf(args[5], &b[5], 0, 1, "nonfinite"))
        || (fa.residual != Py_None && get_buf(fa.residual, &b[6], 1, 4, "residual")))
        goto done;
    Py_ssize_t k = b[3].view.len / 8;
    if (k < 1 || k > MAX_LANES || (!fa.setup && b[4].view.len != 8 * k) || fa.bs < 1) {
        PyErr_SetString(PyExc_ValueError, "fill_round: ptr and pos need 1..64 lanes each, block_size >= 1");
        goto done;
    }
    if (b[6].held && b[6].view.len != b[1].view.len) {
        PyErr_SetString(PyExc_ValueError, "fill_round: residual must have flat's size");
        goto done;
    }
    Py_ssize_t data_at = HEADER_LEN + 4 * k;
    if (b[0].view.len < data_at + fa.item * k * fa.bs) {
        PyErr_SetString(PyExc_ValueError, "fill_round: datagram too short for every lane's row");
        goto done;
    }
    if (fa.shift < -100000 || fa.shift > 100000) {
        PyErr_SetString(PyExc_ValueError, "fill_round: shift out of range");
        goto done;
    }
    unsigned char *dgram = (unsigned char *)b[0].view.buf;
    RoundPlan pl;
    if (plan_round(&pl, dgram, &fa, b))  /* first which lanes send which block, then the rows */
        goto done;
    write_rows(dgram + data_at, &pl, &fa, (const char *)b[1].view.buf,
               b[6].held ? (float *)b[6].view.buf : NULL);
    write_header(dgram, (int)fa.flags | (pl.last ? FLAG_LAST : 0), (int)fa.priority,
                 (uint32_t)fa.round_, (int)fa.exponent, pl.present, pl.nf_bits);
    result = Py_BuildValue("(KKnO)", (unsigned long long)pl.present,
                           (unsigned long long)pl.nf_bits, pl.nrows, pl.last ? Py_True : Py_False);
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
"dequantized as narrow.NumpyRounds.deliver does.");

PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
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
    dequantize_rows(out, n, dgram + data_at, present, pos, k, bs, item, integer, (int)shift);
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

PyMethodDef core_rounds_methods[] = {
    {"fill_round", (PyCFunction)(void (*)(void))fill_round, METH_FASTCALL, fill_round_doc},
    {"deliver", (PyCFunction)(void (*)(void))deliver, METH_FASTCALL, deliver_doc},
    {NULL, NULL, 0, NULL},
};
