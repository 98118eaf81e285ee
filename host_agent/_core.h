/* What the sources of the host agent's compiled core (the one extension host_agent._core)
 * share. One source file per Python module it is the twin of (tests/test_core.py and
 * tests/test_agent_datapath.py compare each with its reference):
 *
 *   _core_blocks.c   host_agent/blocks.py: the block scan, quantize/dequantize rows, the
 *                    narrow lanes' counter-based draws and stochastic rounding
 *   _core_rounds.c   the rounds of host_agent/agent.py's _Call, narrow rows included
 *                    (host_agent/narrow.py's NumpyRounds their reference):
 *                    fill_round (a contribution), deliver (a result)
 *   _core_io.c       the agent's socket side: recv_answers (one recvmmsg; each datagram checked
 *                    as spina/wire.py header_error does), check_answer, send_batch (sendmmsg)
 *   _core_answers.c  the answer loop's common case (answer_batch): host_agent/recovery.py's
 *                    bookkeeping and _Call.on_answer's deliver -> next round -> queue
 *   _core.c          the module: its functions, the loop variants (AVX2 or generic)
 *
 * Each .c lists its Python functions in a PyMethodDef table declared here; _core.c adds them.
 * Symbols are hidden (setup.py: -fvisibility=hidden): only PyInit__core is exported.
 */
#ifndef SPINA_CORE_H
#define SPINA_CORE_H
#include "../spina/_pybuf.h"  /* Python.h, Buf, get_buf, release */
#include "../spina/_wire.h"   /* HEADER_LEN, OFF_*, MSG_*, FLAG_*, load_be/store_be */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_VARIANT 1  /* the hot loops are built twice: for AVX2 and for any CPU */
#endif

/* ---- _core_blocks.c: the per-element kernels, a datagram's rows per call ---- */
/* The narrow lanes' draws of (seed, rank, step): blocks.rounding_noise's key. */
typedef struct {
    uint32_t k0, k1;
} Draws;

/* A row a contribution sends: where its block starts in the tensor, its elements (the partial
 * last block: fewer than the block size), its plan row (the narrow draws' counter), and
 * whether the block holds NaN/Inf (sent as 0). */
typedef struct {
    Py_ssize_t start, count;
    int64_t row;
    int finite_only;
} RowJob;

Draws draws_for(uint64_t seed, uint64_t rank, uint64_t step);
/* blocks.gather_blocks + quantize: `nrows` rows of `bs` 4-byte values into dst, one after
 * another (int32 tensors copied: integer) */
void quantize_rows(unsigned char *dst, const char *flat, const RowJob *rows, Py_ssize_t nrows,
                   Py_ssize_t bs, int integer, int shift);
/* the same in `item`-byte narrow values (stochastic_quantize with the draws dr; residual: the
 * error feedback, or NULL); touches no Python object (the caller may release the GIL) */
void narrow_rows(unsigned char *dst, int item, const float *flat, const RowJob *rows,
                 Py_ssize_t nrows, Py_ssize_t bs, int shift, const Draws *dr, float *residual);
/* dequantize + blocks.scatter_blocks: present lane i's row (in order) into block pos[i] of
 * `out` (n 4-byte values) */
void dequantize_rows(char *out, Py_ssize_t n, const unsigned char *src, uint64_t present,
                     const int64_t *pos, Py_ssize_t k, Py_ssize_t bs, int item, int integer,
                     int shift);
/* the AVX2 loops (1) or the generic ones (0); 0 when asked for AVX2 on a CPU without it */
int use_avx2_loops(int on);
extern PyMethodDef core_blocks_methods[];

/* ---- _core_rounds.c ---- */
PyObject *fill_round(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *deliver(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
extern PyMethodDef core_rounds_methods[];

/* ---- _core_io.c ---- */
extern PyMethodDef core_io_methods[];

/* ---- _core_answers.c ---- */
int init_attr_names(void);  /* once, at import: -1 with an exception on failure */
extern PyMethodDef core_answers_methods[];

#endif
