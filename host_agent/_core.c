/* The host agent's per-datagram work and its socket calls, compiled (issue 12, item 2): the
 * module host_agent._core. Its functions live in one source file per Python module they are
 * the twin of (host_agent/_core.h lists them); this file gathers them and picks the loops.
 *
 * Per datagram, one C call per direction (fill_round, deliver: _core_rounds.c), each reading
 * and writing every byte once; per batch, recv_answers reads every datagram waiting (one
 * recvmmsg) and send_batch sends the queued ones (one sendmmsg: _core_io.c); answer_batch
 * runs the answer loop's common case (_core_answers.c) and hands every other answer back to
 * the agent's Python path, in arrival order. Which packet gets which priority and flags, and
 * every loss-recovery decision, stay Python (host_agent/agent.py, recovery.py, dlcp.py;
 * tests/test_agent_datapath.py runs both paths and compares them bit for bit).
 *
 * The numpy forms in host_agent/blocks.py, host_agent/narrow.py (NumpyRounds) and
 * spina/wire.py (HEADER_STRUCT, header_error) are the reference: tests/test_core.py and
 * tests/test_narrow_lanes.py check both give identical bytes and verdicts.
 */
#include "_core.h"

PyDoc_STRVAR(set_variant_doc,
"set_variant(name)\n\nUse the 'avx2' or the 'generic' loops (tests compare both with the reference).");

static PyObject *set_variant(PyObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    int generic = strcmp(name, "generic") == 0;
    if (!generic && !(strcmp(name, "avx2") == 0 && use_avx2_loops(1))) {
        PyErr_Format(PyExc_ValueError, "variant %R: 'generic', or 'avx2' on a CPU that has it", arg);
        return NULL;
    }
    if (generic)
        use_avx2_loops(0);
    if (PyModule_AddStringConstant(self, "VARIANT", name) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"set_variant", set_variant, METH_O, set_variant_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "host_agent._core",
    "The host agent's per-datagram data work, compiled (host_agent/_core.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__core(void) {
    int avx2 = use_avx2_loops(1);
    if (init_attr_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddFunctions(m, core_blocks_methods) < 0
              || PyModule_AddFunctions(m, core_rounds_methods) < 0
              || PyModule_AddFunctions(m, core_io_methods) < 0
              || PyModule_AddFunctions(m, core_answers_methods) < 0
              || PyModule_AddStringConstant(m, "VARIANT", avx2 ? "avx2" : "generic") < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
