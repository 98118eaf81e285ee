/* The floor (issue 27, item 3): the simplest star all-reduce that moves the bytes of a dense
 * SpINA call, compiled, so a benchmark can say how close SpINA is to what the machine allows.
 * bench/floor.py drives it; bench/README.md says how it is measured.
 *
 * No protocol: no loss recovery, no duplicate detection, no sparsity, no byte-order conversion.
 * The tensor is cut into chunks of `chunk` int32 (SpINA's nlanes x block_size: the same
 * datagrams), each sent as one UDP datagram
 *
 *     u32 chunk index (native byte order) | chunk x int32 (the last chunk may be shorter)
 *
 * with a window of `window` chunks in flight per worker: chunk k + window is sent when chunk
 * k's result came back. The relay keeps one accumulator per window slot (k mod window), adds
 * the N contributions of a chunk there and sends the sum to every worker (one sendmmsg of N
 * datagrams), which dequantizes it into its tensor, in place. Before the data, each worker
 * sends a hello (u32 0xFFFFFFFF, u32 rank, i32 exponent) from the socket it will use; the
 * relay answers every worker (u32 0xFFFFFFFF, i32 the largest exponent) once all N arrived,
 * and keeps their addresses for the results. The shared scale is then SpINA's rule
 * (host_agent/blocks.quant_shift, applied in bench/floor.py), so a floor result is bit for
 * bit what numpy computes from the same quantization (tests/test_floor.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TAG_HELLO 0xFFFFFFFFu
#define HDR 4                       /* bytes of the chunk index before the values */
#define MAX_CHUNK ((65507 - HDR) / 4) /* int32 values in the largest UDP datagram */
#define MAX_WORKERS 256
#define BATCH 64                    /* datagrams per recvmmsg at the relay */

/* Built for AVX2 and for any x86-64, chosen by the loader (gcc's ifunc): rintf vectorises only
 * with AVX2's rounding instruction. */
#if defined(__x86_64__) && defined(__GNUC__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

/* x * 2**shift rounded half to even, as host_agent/blocks.quantize: a multiply by the power of
 * two where it is a normal float32 (always, in practice), else ldexpf. */
CLONES static void quantize(int32_t *dst, const float *src, Py_ssize_t n, int shift) {
    if (shift >= -126 && shift <= 127) {
        const float f = ldexpf(1.0f, shift);
        for (Py_ssize_t j = 0; j < n; j++)
            dst[j] = (int32_t)rintf(src[j] * f);
    } else {
        for (Py_ssize_t j = 0; j < n; j++)
            dst[j] = (int32_t)rintf(ldexpf(src[j], shift));
    }
}

/* (float)sum * 2**-shift, as host_agent/blocks.dequantize. */
CLONES static void dequantize(float *dst, const int32_t *src, Py_ssize_t n, int shift) {
    if (-shift >= -126 && -shift <= 127) {
        const float f = ldexpf(1.0f, -shift);
        for (Py_ssize_t j = 0; j < n; j++)
            dst[j] = (float)src[j] * f;
    } else {
        for (Py_ssize_t j = 0; j < n; j++)
            dst[j] = ldexpf((float)src[j], -shift);
    }
}

/* int32 adds wrap like numpy's; the shared scale keeps sums below 2**30 anyway. */
CLONES static void add_into(int32_t *restrict dst, const int32_t *restrict src, Py_ssize_t n) {
    for (Py_ssize_t j = 0; j < n; j++)
        dst[j] = (int32_t)((uint32_t)dst[j] + (uint32_t)src[j]);
}

/* Send all `n` prepared messages (sendmmsg may take fewer; a non-blocking socket may be full). */
static int send_all(int fd, struct mmsghdr *msgs, unsigned n) {
    unsigned done = 0;
    while (done < n) {
        int k = sendmmsg(fd, msgs + done, n - done, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {fd, POLLOUT, 0};
                if (poll(&p, 1, -1) < 0 && errno != EINTR)
                    return -1;
                continue;
            }
            return -1;
        }
        done += (unsigned)k;
    }
    return 0;
}

/* The window and the chunk both ends agreed on: ValueError naming the bad one. */
static int check_sizes(int window, Py_ssize_t chunk) {
    if (window < 1 || window > 4096) {
        PyErr_Format(PyExc_ValueError, "window: %d is not in 1..4096", window);
        return -1;
    }
    if (chunk < 1 || chunk > MAX_CHUNK) {
        PyErr_Format(PyExc_ValueError, "chunk: %zd is not in 1..%d (one UDP datagram)", chunk,
                     MAX_CHUNK);
        return -1;
    }
    return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *name, const char *fmt) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return -1;
    if (view->itemsize != 4 || view->format == NULL || strcmp(view->format, fmt) != 0) {
        PyErr_Format(PyExc_ValueError, "%s: need a writable C-contiguous buffer of format '%s' "
                     "(4-byte items), got format '%s'", name, fmt,
                     view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------- worker side */
PyDoc_STRVAR(allreduce_doc,
"allreduce(fd, buf, shift, window, chunk, scratch, timeout_ms) -> (datagrams, bytes)\n\n"
"Sum float32 `buf` in place through the relay `fd` is connected to (the hello already done):\n"
"quantize with 2**shift, a window of chunks in flight, dequantize the sums. `scratch`: int32,\n"
"at least 2 * window * (chunk + 1) items. Returns the datagrams and bytes this worker sent.\n"
"TimeoutError if no result came for timeout_ms (a lost datagram: there is no recovery).");

static PyObject *allreduce(PyObject *self, PyObject *args) {
    int fd, shift, window, timeout_ms;
    Py_ssize_t chunk;
    PyObject *buf_obj, *scratch_obj;
    if (!PyArg_ParseTuple(args, "iOiinOi", &fd, &buf_obj, &shift, &window, &chunk,
                          &scratch_obj, &timeout_ms))
        return NULL;
    if (check_sizes(window, chunk) < 0)
        return NULL;
    Py_buffer buf, scratch;
    if (get_buffer(buf_obj, &buf, "buf", "f") < 0)
        return NULL;
    if (get_buffer(scratch_obj, &scratch, "scratch", "i") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const Py_ssize_t stride = chunk + 1;  /* int32 per datagram buffer: index + values */
    if (scratch.len / 4 < 2 * window * stride) {
        PyErr_Format(PyExc_ValueError, "scratch: %zd int32, need 2 * window * (chunk + 1) = %zd",
                     scratch.len / 4, 2 * window * stride);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&scratch);
        return NULL;
    }
    float *x = (float *)buf.buf;
    const Py_ssize_t n = buf.len / 4, nchunks = (n + chunk - 1) / chunk;
    int32_t *sbuf = (int32_t *)scratch.buf, *rbuf = sbuf + window * stride;
    struct mmsghdr *smsg = calloc((size_t)window, sizeof *smsg);
    struct mmsghdr *rmsg = calloc((size_t)window, sizeof *rmsg);
    struct iovec *siov = calloc((size_t)window, sizeof *siov);
    struct iovec *riov = calloc((size_t)window, sizeof *riov);
    int64_t *expect = malloc((size_t)window * sizeof *expect);  /* chunk awaited per slot */
    if (!smsg || !rmsg || !siov || !riov || !expect) {
        free(smsg); free(rmsg); free(siov); free(riov); free(expect);
        PyBuffer_Release(&buf);
        PyBuffer_Release(&scratch);
        return PyErr_NoMemory();
    }
    long long sent = 0, sent_bytes = 0;
    int err = 0;            /* errno of a failed socket call */
    int64_t bad = -1;       /* an unexpected result's chunk index, or -2: wrong length */
    Py_ssize_t done = 0;
    int timed_out = 0;

    Py_BEGIN_ALLOW_THREADS
    for (int i = 0; i < window; i++) {
        riov[i].iov_base = rbuf + i * stride;
        riov[i].iov_len = (size_t)(4 * stride);
        rmsg[i].msg_hdr.msg_iov = &riov[i];
        rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    unsigned nq = 0;
    /* chunk k's datagram: quantized into slot k mod window, queued for the next send_all */
#define QUEUE(k) do {                                                             \
        int s_ = (int)((k) % window);                                             \
        Py_ssize_t lo_ = (k) * chunk, len_ = n - lo_ < chunk ? n - lo_ : chunk;     \
        int32_t *d_ = sbuf + s_ * stride;                                         \
        d_[0] = (int32_t)(uint32_t)(k);                                           \
        quantize(d_ + 1, x + lo_, len_, shift);                                   \
        siov[nq].iov_base = d_;                                                   \
        siov[nq].iov_len = (size_t)(HDR + 4 * len_);                              \
        memset(&smsg[nq].msg_hdr, 0, sizeof smsg[nq].msg_hdr);                    \
        smsg[nq].msg_hdr.msg_iov = &siov[nq];                                     \
        smsg[nq].msg_hdr.msg_iovlen = 1;                                          \
        sent_bytes += (long long)siov[nq].iov_len;                                \
        expect[s_] = (k);                                                         \
        nq++;                                                                     \
    } while (0)
    for (int s = 0; s < window; s++)
        expect[s] = -1;
    for (Py_ssize_t k = 0; k < nchunks && k < window; k++)
        QUEUE(k);
    if (send_all(fd, smsg, nq) < 0)
        err = errno;
    sent += nq;
    while (!err && bad == -1 && done < nchunks) {
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, timeout_ms);
        if (r == 0) {
            timed_out = 1;
            break;
        }
        if (r < 0) {
            if (errno != EINTR)
                err = errno;
            continue;
        }
        int got = recvmmsg(fd, rmsg, (unsigned)window, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                err = errno;
            continue;
        }
        nq = 0;
        for (int i = 0; i < got; i++) {
            const int32_t *d = rbuf + i * stride;
            int64_t k = (int64_t)(uint32_t)d[0];
            if (rmsg[i].msg_len < HDR || k >= nchunks || expect[k % window] != k) {
                bad = rmsg[i].msg_len < HDR ? -2 : k;
                break;
            }
            Py_ssize_t lo = (Py_ssize_t)k * chunk, len = n - lo < chunk ? n - lo : chunk;
            if (rmsg[i].msg_len != (unsigned)(HDR + 4 * len)) {
                bad = -2;
                break;
            }
            dequantize(x + lo, d + 1, len, shift);
            done++;
            expect[k % window] = -1;
            if (k + window < nchunks)
                QUEUE(k + window);
        }
        if (send_all(fd, smsg, nq) < 0)
            err = errno;
        sent += nq;
    }
#undef QUEUE
    Py_END_ALLOW_THREADS

    free(smsg); free(rmsg); free(siov); free(riov); free(expect);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&scratch);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (timed_out) {
        PyErr_Format(PyExc_TimeoutError, "floor: no result for %d ms with %zd of %zd chunks "
                     "back: a datagram was lost (the floor has no recovery)", timeout_ms, done,
                     nchunks);
        return NULL;
    }
    if (bad == -2) {
        PyErr_SetString(PyExc_RuntimeError, "floor: a result of the wrong length");
        return NULL;
    }
    if (bad != -1) {
        PyErr_Format(PyExc_RuntimeError, "floor: result for chunk %lld, which is not in flight",
                     (long long)bad);
        return NULL;
    }
    return Py_BuildValue("LL", sent, sent_bytes);
}

/* ---------------------------------------------------------------------------- relay side */
PyDoc_STRVAR(relay_doc,
"relay(fd, stop_fd, nworkers, window, chunk) -> dict of counters\n\n"
"Serve calls on UDP socket `fd` until `stop_fd` is readable: per call a hello round (the\n"
"largest exponent to every worker), then per chunk the sum of the N workers' int32 to each.\n"
"Returns datagrams_in, datagrams_out, bytes_in, bytes_out, results, calls.\n"
"RuntimeError on a datagram the floor cannot place (it has no protocol to recover).");

typedef struct {
    int32_t *buf;     /* index + values of the first contribution, then the running sum */
    int64_t chunk;    /* its chunk index */
    unsigned len;     /* its datagram length */
    int count;        /* contributions added */
} Slot;

static PyObject *relay(PyObject *self, PyObject *args) {
    int fd, stop_fd, nworkers, window;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "iiiin", &fd, &stop_fd, &nworkers, &window, &chunk))
        return NULL;
    if (nworkers < 1 || nworkers > MAX_WORKERS) {
        PyErr_Format(PyExc_ValueError, "nworkers: %d is not in 1..%d", nworkers, MAX_WORKERS);
        return NULL;
    }
    if (check_sizes(window, chunk) < 0)
        return NULL;
    const size_t dgram = (size_t)(HDR + 4 * chunk), cap = dgram + 4;  /* +4: catch too long */
    Slot *slots = calloc((size_t)window, sizeof *slots);
    int32_t **rb = calloc(BATCH, sizeof *rb);
    int32_t *pool = malloc((size_t)(window + BATCH) * cap);
    struct sockaddr_in *from = calloc(BATCH, sizeof *from);
    struct sockaddr_in *addr = calloc((size_t)nworkers, sizeof *addr);
    unsigned char *heard = calloc((size_t)nworkers, 1);
    struct mmsghdr *rmsg = calloc(BATCH, sizeof *rmsg), *smsg = calloc((size_t)nworkers,
                                                                           sizeof *smsg);
    struct iovec *riov = calloc(BATCH, sizeof *riov), siov;
    if (!slots || !rb || !pool || !from || !addr || !heard || !rmsg || !smsg || !riov) {
        free(slots); free(rb); free(pool); free(from); free(addr); free(heard);
        free(rmsg); free(smsg); free(riov);
        return PyErr_NoMemory();
    }
    for (int s = 0; s < window; s++)
        slots[s].buf = (int32_t *)((char *)pool + (size_t)s * cap);
    for (int i = 0; i < BATCH; i++)
        rb[i] = (int32_t *)((char *)pool + (size_t)(window + i) * cap);
    for (int r = 0; r < nworkers; r++) {
        smsg[r].msg_hdr.msg_name = &addr[r];
        smsg[r].msg_hdr.msg_namelen = sizeof addr[r];
        smsg[r].msg_hdr.msg_iov = &siov;
        smsg[r].msg_hdr.msg_iovlen = 1;
    }
    long long din = 0, dout = 0, bin = 0, bout = 0, results = 0, calls = 0;
    int err = 0, nheard = 0;
    int32_t emax = INT32_MIN, reply[2];
    const char *bad = NULL;
    long long bad_value = 0;

    Py_BEGIN_ALLOW_THREADS
    struct pollfd p[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    while (!err && !bad) {
        if (poll(p, 2, -1) < 0) {
            if (errno != EINTR)
                err = errno;
            continue;
        }
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        for (int i = 0; i < BATCH; i++) {  /* a slot may have taken the last batch's buffer */
            riov[i].iov_base = rb[i];
            riov[i].iov_len = cap;
            memset(&rmsg[i].msg_hdr, 0, sizeof rmsg[i].msg_hdr);
            rmsg[i].msg_hdr.msg_iov = &riov[i];
            rmsg[i].msg_hdr.msg_iovlen = 1;
            rmsg[i].msg_hdr.msg_name = &from[i];
            rmsg[i].msg_hdr.msg_namelen = sizeof from[i];
        }
        int got = recvmmsg(fd, rmsg, BATCH, MSG_DONTWAIT, NULL);
        if (got < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                err = errno;
            continue;
        }
        din += got;
        for (int i = 0; i < got && !err && !bad; i++) {
            const unsigned len = rmsg[i].msg_len;
            int32_t *d = rb[i];
            bin += len;
            if (len < HDR || len > dgram || (len - HDR) % 4) {
                bad = "a datagram of %lld bytes";
                bad_value = len;
                break;
            }
            if ((uint32_t)d[0] == TAG_HELLO) {
                int32_t rank = len == 12 ? d[1] : -1;
                if (rank < 0 || rank >= nworkers || heard[rank]) {
                    bad = "a hello of rank %lld twice, or out of range, or malformed";
                    bad_value = rank;
                    break;
                }
                heard[rank] = 1;
                addr[rank] = from[i];
                if (d[2] > emax)
                    emax = d[2];
                if (++nheard == nworkers) {  /* every worker's exponent: answer the largest */
                    reply[0] = (int32_t)TAG_HELLO;
                    reply[1] = emax;
                    siov.iov_base = reply;
                    siov.iov_len = sizeof reply;
                    if (send_all(fd, smsg, (unsigned)nworkers) < 0)
                        err = errno;
                    dout += nworkers;
                    bout += (long long)nworkers * (long long)sizeof reply;
                    calls++;
                    nheard = 0;
                    emax = INT32_MIN;
                    memset(heard, 0, (size_t)nworkers);
                }
                continue;
            }
            const int64_t k = (int64_t)(uint32_t)d[0];
            Slot *s = &slots[k % window];
            if (s->count == 0) {  /* first contribution: keep its buffer, no copy */
                rb[i] = s->buf;
                s->buf = d;
                s->chunk = k;
                s->len = len;
            } else if (s->chunk != k || s->len != len) {
                bad = "chunk %lld while its slot holds another (more in flight than the window)";
                bad_value = k;
                break;
            } else {
                add_into(s->buf + 1, d + 1, (Py_ssize_t)(len - HDR) / 4);
            }
            if (++s->count == nworkers) {
                siov.iov_base = s->buf;
                siov.iov_len = s->len;
                if (send_all(fd, smsg, (unsigned)nworkers) < 0)
                    err = errno;
                dout += nworkers;
                bout += (long long)nworkers * s->len;
                results++;
                s->count = 0;
            }
        }
    }
    Py_END_ALLOW_THREADS

    free(slots); free(rb); free(pool); free(from); free(addr); free(heard);
    free(rmsg); free(smsg); free(riov);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (bad) {
        PyObject *msg = PyUnicode_FromFormat(bad, bad_value);
        if (msg) {
            PyErr_Format(PyExc_RuntimeError, "floor relay: %U", msg);
            Py_DECREF(msg);
        }
        return NULL;
    }
    return Py_BuildValue("{sLsLsLsLsLsL}", "datagrams_in", din, "datagrams_out", dout,
                         "bytes_in", bin, "bytes_out", bout, "results", results, "calls", calls);
}

static PyMethodDef methods[] = {
    {"allreduce", allreduce, METH_VARARGS, allreduce_doc},
    {"relay", relay, METH_VARARGS, relay_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bench._floor",
    "The floor's worker and relay loops, compiled (bench/_floor.c; bench/floor.py drives them).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__floor(void) {
    return PyModule_Create(&module);
}
