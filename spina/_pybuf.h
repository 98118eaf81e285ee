/* Buffer arguments of the C extensions (host_agent/_core*.c, host_agent/compression/_kernels.c,
 * softswitch/_datapath.c): a C-contiguous view held until release(). Shared, so it lives in
 * spina/ beside _wire.h, the one package every other may include from (docs/architecture.md). */
#ifndef SPINA_PYBUF_H
#define SPINA_PYBUF_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    Py_buffer view;
    int held;
} Buf;

/* The C-contiguous buffer of `obj` (writable if asked) into *b; `itemsize` > 0: its length
 * must be a whole number of such items. -1 with an exception naming `name` on failure (the
 * caller still release()s b). */
static inline int get_buf(PyObject *obj, Buf *b, int writable, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
                           | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    b->held = 1;
    if (itemsize && b->view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of %zd-byte items",
                     name, b->view.len, itemsize);
        return -1;
    }
    return 0;
}

/* An entry point's argument count: 1 if it is `want`, else 0 with a TypeError naming `fn`. */
static inline int nargs_is(const char *fn, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs == want)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s takes %zd arguments (%zd given)", fn, want, nargs);
    return 0;
}

/* A block size argument: *bs = int(obj), at least 1; else -1 with an exception naming `fn`. */
static inline int block_size_arg(PyObject *obj, const char *fn, Py_ssize_t *bs) {
    *bs = PyLong_AsSsize_t(obj);
    if (*bs == -1 && PyErr_Occurred())
        return -1;
    if (*bs < 1) {
        PyErr_Format(PyExc_ValueError, "%s: block_size >= 1", fn);
        return -1;
    }
    return 0;
}

static inline void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held)
            PyBuffer_Release(&bufs[i].view);
}
#endif
