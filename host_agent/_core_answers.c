/* The answer loop's common case, compiled: result -> deliver -> next round -> queue (the twin
 * of host_agent/recovery.py's Recovery.result and Recovery.sent and of _Call.on_answer's
 * common path in host_agent/agent.py; tests/test_agent_datapath.py runs both paths and
 * compares them bit for bit). Every other answer, and every loss-recovery decision, stays
 * Python: answer_batch stops at the first answer that is not the common case.
 */
#include "_core.h"
#include <math.h>

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
int init_attr_names(void) {
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
       C_WIDTH, C_DRAWS, C_RESIDUAL, C_OWNERS, C_LEN };

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


/* One batch's state: what the Python path updates per answer (the latency estimate, the
 * sequence number, the call's counters), carried here and written back once (write_back). */
typedef struct {
    PyObject *const *ctx;
    PyObject *views, *now;
    double t_now, srtt, rttvar;
    int64_t *rounds;
    long long seq, k, next_end, row_bytes;
    long width;  /* the call's lane width flag (0: int32) */
    long long received, bytes_received, nrounds, sent, bytes_sent, payload, finished;
    int recheck;
} Batch;

/* Recovery.result(tm, st.round, now, multicast=True, partial=False, held_for=0) for answer
 * `a`: the slot's progress, the latency sample (RttEstimator.sample's and its group's), RACK,
 * the answered round's record. 0, or -1 with an exception. */
static int record_result(Batch *bt, PyObject *a, PyObject *tm, PyObject *last_seq) {
    PyObject *flying = bt->ctx[C_FLYING], *rack = bt->ctx[C_RACK];
    PyObject *group_srtt = bt->ctx[C_GROUP_SRTT];
    PyObject *group = NULL, *tm_seq = NULL, *latency_obj = NULL, *r = NULL, *x = NULL;
    PyObject *timed_out = NULL, *hold_resent = NULL;
    int err = -1;
    double first_sent_at = attr_double(tm, s_first_sent_at);
    if (PyErr_Occurred() || PyObject_SetAttr(tm, s_progress_at, bt->now)
        || set_attr_ll(tm, s_unanswered, 0) || dict_discard(flying, last_seq)
        || (group = PyObject_GetAttr(tm, s_group)) == NULL)
        goto done;
    /* RttEstimator.sample in its order of operations: bit-identical doubles (no FMA: this
     * file's baseline x86-64 code cannot contract a * b + c) */
    double latency = bt->t_now - first_sent_at;
    bt->rttvar = 0.75 * bt->rttvar + 0.25 * fabs(bt->srtt - latency);
    bt->srtt = 0.875 * bt->srtt + 0.125 * latency;
    PyObject *g = PyDict_GetItemWithError(group_srtt, group);
    if (g == NULL && PyErr_Occurred())
        goto done;
    double gs = g == NULL ? latency : 0.875 * PyFloat_AsDouble(g) + 0.125 * latency;
    if (PyErr_Occurred() || (latency_obj = PyFloat_FromDouble(latency)) == NULL
        || (x = PyFloat_FromDouble(gs)) == NULL || PyDict_SetItem(group_srtt, group, x))
        goto done;
    /* RACK: the latest-sent round known answered, per slot group */
    if ((tm_seq = PyObject_GetAttr(tm, s_seq)) == NULL)
        goto done;
    long long tseq = PyLong_AsLongLong(tm_seq), rack_seq = 0;
    PyObject *known = PyDict_GetItemWithError(rack, group);
    if (known != NULL)
        rack_seq = PyLong_AsLongLong(PyTuple_GetItem(known, 0));
    if (PyErr_Occurred())
        goto done;
    if (tseq > rack_seq) {
        if ((r = PyTuple_Pack(2, tm_seq, latency_obj)) == NULL || PyDict_SetItem(rack, group, r))
            goto done;
        Py_ssize_t at = 0;
        PyObject *first, *val;
        if (PyDict_Next(flying, &at, &first, &val)) {
            long long f = PyLong_AsLongLong(first);
            if (PyErr_Occurred())
                goto done;
            bt->recheck |= f < tseq;
        }
    }
    if ((timed_out = PyObject_GetAttr(tm, s_timed_out)) == NULL
        || (hold_resent = PyObject_GetAttr(tm, s_hold_resent)) == NULL)
        goto done;
    if (PyObject_SetAttr(tm, s_prev_round, PyTuple_GET_ITEM(a, 4))
        || set_attr_ll(tm, s_prev_resends, 0)
        || PyObject_SetAttr(tm, s_prev_timed_out, timed_out)
        || PyObject_SetAttr(tm, s_prev_hold_resent, hold_resent)
        || set_attr_ll(tm, s_held_for, 0) || PyObject_SetAttr(tm, s_hold_risk, Py_False)
        || PyObject_SetAttr(tm, s_prev_latency, latency_obj))
        goto done;
    err = 0;
done:
    Py_XDECREF(group);
    Py_XDECREF(tm_seq);
    Py_XDECREF(latency_obj);
    Py_XDECREF(r);
    Py_XDECREF(x);
    Py_XDECREF(timed_out);
    Py_XDECREF(hold_resent);
    return err;
}

/* deliver: the sums into their blocks; st.pos becomes the next round's positions. 1 the
 * slot's stream is complete, 0 more rounds follow, -1 an exception. */
static int deliver_answer(Batch *bt, PyObject *a, PyObject *view, PyObject *pos, PyObject *shift) {
    PyObject *const *ctx = bt->ctx;
    PyObject *dargs[9] = {view, ctx[C_OUT], pos, PyTuple_GET_ITEM(a, 7), PyTuple_GET_ITEM(a, 8),
                          shift, ctx[C_INTEGER], ctx[C_B], ctx[C_WIDTH]};
    PyObject *done = deliver(NULL, dargs, 9);
    if (done == NULL)
        return -1;
    bt->nrounds++;
    int complete = done == Py_True;
    Py_DECREF(done);
    return complete;
}

/* A reduce-scatter's round (ctx[C_OWNERS] = (length, shard size, block size): scatter.Owners):
 * the bitmap of the ranks owning any element of the blocks at the round's positions `pos`
 * (int64, k lanes; negative or END: none) into the datagram `buf`'s header, as
 * host_agent/scatter.py Owners.of computes it. 0, or -1 with an exception. */
static int write_owners(Batch *bt, PyObject *buf, PyObject *pos) {
    PyObject *own = bt->ctx[C_OWNERS];
    long long n = PyLong_AsLongLong(PyTuple_GetItem(own, 0));
    long long chunk = PyLong_AsLongLong(PyTuple_GetItem(own, 1));
    long long bs = PyLong_AsLongLong(PyTuple_GetItem(own, 2));
    if (PyErr_Occurred())
        return -1;
    Buf pb;
    memset(&pb, 0, sizeof pb);
    if (get_buf(pos, &pb, 0, 8, "pos") < 0 || pb.view.len / 8 < bt->k
        || !PyByteArray_Check(buf) || PyByteArray_GET_SIZE(buf) < HEADER_LEN || chunk < 1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "answer_batch: owners need k positions, a "
                            "datagram buffer and a shard size >= 1");
        release(&pb, 1);
        return -1;
    }
    const int64_t *p = pb.view.buf;
    uint64_t bits = 0;
    for (long long i = 0; i < bt->k; i++) {
        if (p[i] < 0 || p[i] >= (int64_t)END_POS)
            continue;
        long long first = p[i] * bs, last = first + bs < n ? first + bs : n;
        long long lo = first / chunk, hi = (last - 1) / chunk;
        bits |= (2ull << hi) - (1ull << lo);
    }
    release(&pb, 1);
    unsigned char *h = (unsigned char *)PyByteArray_AS_STRING(buf);
    uint32_t v = (uint32_t)bits;
    h[OFF_BITMAP] = (unsigned char)(v >> 24);
    h[OFF_BITMAP + 1] = (unsigned char)(v >> 16);
    h[OFF_BITMAP + 2] = (unsigned char)(v >> 8);
    h[OFF_BITMAP + 3] = (unsigned char)v;
    return 0;
}

/* _next_round without bounded loss or droppable packets (the job's priority, no flags but the
 * lane width), tagged as _new_round tags it: fill_round into slot s's datagram buffer. The
 * number of rows written, or -1 with an exception. */
static long long fill_next_round(Batch *bt, long long s, PyObject *st, PyObject *pos,
                                 PyObject *shift) {
    PyObject *const *ctx = bt->ctx;
    int64_t tag = bt->rounds[s] + 1;
    bt->rounds[s] = tag;
    PyObject *ptr = PyObject_GetAttr(st, s_ptr), *expo = PyObject_GetAttr(st, s_exponent);
    PyObject *rnd = PyLong_FromUnsignedLongLong((uint64_t)tag & 0xFFFFFFFFu);
    PyObject *lane0 = PyLong_FromLongLong(s * bt->k);
    PyObject *bufs = ctx[C_BUFS];
    PyObject *buf = s < PyList_GET_SIZE(bufs) ? PyTuple_GetItem(PyList_GET_ITEM(bufs, s), 0)
                                               : NULL;
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
    if (filled == NULL)
        return -1;
    long long nrows = PyLong_AsLongLong(PyTuple_GET_ITEM(filled, 2));
    Py_DECREF(filled);
    if (ctx[C_OWNERS] != Py_None && write_owners(bt, buf, pos) < 0)
        return -1;
    return nrows;
}

/* _queue: the datagram's view up to its rows, Recovery.sent(tm, now, flushable=True), the
 * outbox. 0, or -1 with an exception. */
static int queue_round(Batch *bt, PyObject *st, PyObject *tm, PyObject *last_seq,
                       long long nrows) {
    long long len = bt->next_end + bt->row_bytes * nrows;
    PyObject *view = PyObject_GetAttr(st, s_view), *packet = NULL;
    if (view != NULL)
        packet = PySequence_GetSlice(view, 0, (Py_ssize_t)len);
    Py_XDECREF(view);
    if (packet == NULL)
        return -1;
    PyObject *flying = bt->ctx[C_FLYING], *now = bt->now;
    PyObject *seq_obj = PyLong_FromLongLong(++bt->seq);
    int e = seq_obj == NULL || PyObject_SetAttr(st, s_packet, packet)
        || dict_discard(flying, last_seq) || PyDict_SetItem(flying, seq_obj, tm)
        || PyObject_SetAttr(tm, s_seq, seq_obj) || PyObject_SetAttr(tm, s_last_seq, seq_obj)
        || PyObject_SetAttr(tm, s_first_sent_at, now) || PyObject_SetAttr(tm, s_sent_at, now)
        || set_attr_ll(tm, s_resends, 0) || set_attr_ll(tm, s_statuses, 0)
        || PyObject_SetAttr(tm, s_flush, Py_False)
        || PyObject_SetAttr(tm, s_timed_out, Py_False)
        || PyObject_SetAttr(tm, s_hold_resent, Py_False)
        || PyObject_SetAttr(tm, s_flushable, Py_True) || PyList_Append(bt->ctx[C_OUTBOX], packet);
    Py_XDECREF(seq_obj);
    Py_DECREF(packet);
    if (e)
        return -1;
    bt->sent++;
    bt->bytes_sent += len;
    bt->payload += bt->row_bytes * nrows;
    return 0;
}

/* Answer `a` if it is the common case: 1 handled, 0 not the common case (the Python path's),
 * -1 an exception. */
static int answer_one(Batch *bt, PyObject *a) {
    PyObject *slots = bt->ctx[C_SLOTS];
    if (!PyTuple_Check(a) || PyTuple_GET_SIZE(a) != 11) {
        PyErr_SetString(PyExc_TypeError, "answer_batch: an answer is not recv_answers' tuple");
        return -1;
    }
    long long index = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 0));
    long long s = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 1));
    long long nbytes = PyLong_AsLongLong(PyTuple_GET_ITEM(a, 10));
    if (PyErr_Occurred())
        return -1;
    if (s < 0 || s >= PyList_GET_SIZE(slots) || index < 0 || index >= PyList_GET_SIZE(bt->views)) {
        PyErr_SetString(PyExc_IndexError, "answer_batch: slot or ring index out of range");
        return -1;
    }
    PyObject *st = PyList_GET_ITEM(slots, s);
    PyObject *tm = PyObject_GetAttr(st, s_timer);
    if (tm == NULL)
        return -1;
    PyObject *last_seq = NULL, *pos = NULL, *shift = NULL;
    int ret = common_answer(a, st, tm, bt->width);
    if (ret <= 0)
        goto done;
    ret = -1;
    if ((last_seq = PyObject_GetAttr(tm, s_last_seq)) == NULL
        || record_result(bt, a, tm, last_seq))
        goto done;
    bt->received++;
    bt->bytes_received += nbytes;
    if ((pos = PyObject_GetAttr(st, s_pos)) == NULL
        || (shift = PyObject_GetAttr(st, s_shift)) == NULL)
        goto done;
    int complete = deliver_answer(bt, a, PyList_GET_ITEM(bt->views, index), pos, shift);
    if (complete < 0)
        goto done;
    if (complete) {
        bt->finished++;
        ret = PyObject_SetAttr(st, s_done, Py_True) < 0 ? -1 : 1;
        goto done;
    }
    long long nrows = fill_next_round(bt, s, st, pos, shift);
    if (nrows >= 0 && queue_round(bt, st, tm, last_seq, nrows) == 0)
        ret = 1;
done:
    Py_XDECREF(last_seq);
    Py_XDECREF(pos);
    Py_XDECREF(shift);
    Py_DECREF(tm);
    return ret;
}

/* What the Python path keeps per answer, written back once per batch. 0, or -1. */
static int write_back(const Batch *bt) {
    PyObject *rec = bt->ctx[C_REC], *rtt = bt->ctx[C_RTT], *stats = bt->ctx[C_STATS];
    if (bt->received && (PyObject_SetAttr(rec, s_timer_from, bt->now)
                         || set_attr_ll(rec, s_backoff, 0)
                         || set_attr_double(rtt, s_srtt, bt->srtt)
                         || set_attr_double(rtt, s_rttvar, bt->rttvar)))
        return -1;
    if (set_attr_ll(rec, s_seq, bt->seq)
        || (bt->recheck && PyObject_SetAttr(rec, s_recheck, Py_True))
        || add_attr_ll(stats, s_packets_received, bt->received)
        || add_attr_ll(stats, s_bytes_received, bt->bytes_received)
        || add_attr_ll(stats, s_rounds, bt->nrounds) || add_attr_ll(stats, s_packets_sent, bt->sent)
        || add_attr_ll(stats, s_bytes_sent, bt->bytes_sent)
        || add_attr_ll(stats, s_payload_bytes_sent, bt->payload))
        return -1;
    return 0;
}

static PyObject *answer_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != C_LEN
        || !PyList_Check(args[1]) || !PyList_Check(args[2]) || !PyFloat_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "answer_batch(ctx tuple, answers list, views list, start, now float)");
        return NULL;
    }
    PyObject *const *ctx = &PyTuple_GET_ITEM(args[0], 0);
    PyObject *answers = args[1];
    if (!PyList_Check(ctx[C_SLOTS]) || !PyDict_Check(ctx[C_FLYING]) || !PyDict_Check(ctx[C_RACK])
        || !PyDict_Check(ctx[C_GROUP_SRTT]) || !PyList_Check(ctx[C_BUFS])
        || !PyList_Check(ctx[C_OUTBOX])) {
        PyErr_SetString(PyExc_TypeError, "answer_batch: ctx holds the wrong types");
        return NULL;
    }
    Batch bt = {.ctx = ctx, .views = args[2], .now = args[4]};
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    bt.k = PyLong_AsLongLong(ctx[C_K]);
    long long bs = PyLong_AsLongLong(ctx[C_B]);
    bt.next_end = PyLong_AsLongLong(ctx[C_NEXT_END]);
    bt.width = PyLong_AsLong(ctx[C_WIDTH]);
    bt.row_bytes = (long long)LANE_ITEM_BYTES(bt.width) * bs;
    bt.t_now = PyFloat_AS_DOUBLE(bt.now);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(answers);
    if (i < 0 || i > n) {
        PyErr_SetString(PyExc_IndexError, "answer_batch: start outside answers");
        return NULL;
    }
    Buf rb;
    memset(&rb, 0, sizeof rb);
    if (get_buf(ctx[C_ROUNDS], &rb, 1, 8, "rounds"))
        goto fail;
    if (rb.view.len / 8 < PyList_GET_SIZE(ctx[C_SLOTS])) {
        PyErr_SetString(PyExc_ValueError, "answer_batch: rounds shorter than the slots");
        goto fail;
    }
    bt.rounds = (int64_t *)rb.view.buf;
    PyObject *srtt_obj = PyObject_GetAttr(ctx[C_RTT], s_srtt);
    if (srtt_obj == NULL)
        goto fail;
    int estimated = srtt_obj != Py_None;  /* the first sample is the Python path's */
    bt.srtt = estimated ? PyFloat_AsDouble(srtt_obj) : 0.0;
    Py_DECREF(srtt_obj);
    bt.rttvar = attr_double(ctx[C_RTT], s_rttvar);
    bt.seq = attr_ll(ctx[C_REC], s_seq);
    if (PyErr_Occurred())
        goto fail;
    for (; estimated && i < n; i++) {
        int r = answer_one(&bt, PyList_GET_ITEM(answers, i));
        if (r < 0)
            goto fail;
        if (r == 0)
            break;
    }
    release(&rb, 1);
    if (write_back(&bt))
        return NULL;
    return Py_BuildValue("(nL)", i, bt.finished);
fail:
    release(&rb, 1);
    return NULL;
}

PyMethodDef core_answers_methods[] = {
    {"answer_batch", (PyCFunction)(void (*)(void))answer_batch, METH_FASTCALL, answer_batch_doc},
    {NULL, NULL, 0, NULL},
};
