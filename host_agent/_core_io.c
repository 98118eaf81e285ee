/* The socket side of the host agent's compiled core: every answer waiting in one recvmmsg,
 * each checked as spina/wire.py header_error checks it (tests/test_core.py compares the
 * verdicts), and a batch of sends in one sendmmsg. Which datagram the agent sends when, and
 * what an answer means to its call, stay the agent's (host_agent/agent.py). */
#include "_core.h"
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

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

PyMethodDef core_io_methods[] = {
    {"check_answer", (PyCFunction)(void (*)(void))check_answer, METH_FASTCALL, check_answer_doc},
    {"recv_answers", (PyCFunction)(void (*)(void))recv_answers, METH_FASTCALL, recv_answers_doc},
    {"send_batch", (PyCFunction)(void (*)(void))send_batch, METH_FASTCALL, send_batch_doc},
    {NULL, NULL, 0, NULL},
};
