/* The L2 mode's compiled frames (issue 27, item 1): softswitch/dataplane.py's Dataplane.process
 * for its common case, around _datapath.c's per-packet core. This file is part of _datapath.c
 * (included at its end: one translation unit, so process_one has one definition).
 *
 * A frame served here: Ethernet II | IPv4 with ihl 5 | UDP to the INA port | a contribution, to
 * an ina_endpoint address, whole (its UDP length within the frame), of a flat job admitted on
 * the frame's ingress port. The P4 admission key includes the ingress port, so each port has a
 * core Datapath of its own holding that port's rows (fd -1: the cores never touch a socket);
 * all of them run on the one Pipeline's registers and counters. A result leaves as Python's
 * Dataplane writes it (_terminate, _egress): the reply header (MACs, IPv4 addresses and UDP
 * ports swapped, lengths, UDP checksum 0), back to the sender on its ingress port, or once per
 * replica of the job's multicast group with worker_rewrite's MAC, IPv4 address and UDP port
 * (softswitch/compiled_frames.py lists only the replicas that have a rewrite); the IPv4
 * checksum recomputed. CongestionDrop takes contributions only, and what leaves here is a
 * result or a status, so egress drops none of it. Every other frame is punted to Python's
 * Dataplane in arrival order, nothing read or written (tests/test_datapath_l2.py compares both
 * paths frame by frame, register by register).
 */
#include <linux/if_packet.h>

#define ETH_LEN 14
#define L4_OFF 34   /* UDP header */
#define INA_OFF 42  /* INA header: what a result frame's header is */
#define FRAME_MAX 65536
#define PORT_SLOTS 512  /* v1model's 9-bit port (spina.spec MAX_PORTS) */
#define SEND_QUEUE 256  /* copies queued per port before its sendmmsg */

typedef struct {
    uint8_t mac[6];
    uint32_t ip;      /* host byte order */
    uint16_t udp;
    int32_t port;     /* egress port number */
    int32_t sock;     /* its index in ports[] if it has a socket, else -1 */
} Replica;

typedef struct {
    int32_t port, fd;  /* fd -1: no socket (process() only) */
    Datapath *core;    /* this ingress port's admission rows; NULL: none */
    struct mmsghdr *msg;
    struct iovec *iov;  /* two per copy: its header, the shared INA packet */
    uint8_t *heads;     /* INA_OFF bytes per copy */
    int count;
} Port;

typedef struct {
    PyObject_HEAD
    PyObject *cores;  /* the references behind ports[].core */
    Port *ports;
    int nports;
    int16_t slot_of[PORT_SLOTS];
    uint32_t *endpoints;
    int nendpoints;
    Replica *reps;
    int nreps;
    uint16_t udp_port;
    int batch;
    /* receive batch (of one port's socket) */
    uint8_t *rbuf;
    struct mmsghdr rmsg[BATCH];
    struct iovec riov[BATCH];
    struct sockaddr_ll raddr[BATCH];
    int rcount, rnext, rport;  /* rport: the batch's port number */
    /* the INA packets out: one per frame of the batch, and one for process() */
    uint8_t *obuf;
    Py_ssize_t out_len;
    int oused;
    unsigned long long frames_in, bytes_in, frames_out, bytes_out, send_errors;
} FramePath;

static void ipv4_checksum(uint8_t *f) {  /* RFC 791, as dataplane.with_ipv4_checksum */
    f[24] = f[25] = 0;
    uint32_t s = 0;
    for (int i = ETH_LEN; i < L4_OFF; i += 2)
        s += load_be16(f + i);
    s = (s & 0xFFFF) + (s >> 16);
    s = (s & 0xFFFF) + (s >> 16);
    store_be16(f + 24, (uint16_t)~s);
}

/* reply_to_sender: the frame's first INA_OFF bytes with addresses and ports swapped and the
 * lengths of an INA packet of n bytes (Dataplane._terminate). */
static void reply_head(uint8_t *h, const uint8_t *fr, Py_ssize_t n) {
    memcpy(h + 12, fr + 12, L4_OFF - 12);
    memcpy(h, fr + 6, 6);
    memcpy(h + 6, fr, 6);
    memcpy(h + 26, fr + 30, 4);
    memcpy(h + 30, fr + 26, 4);
    memcpy(h + 34, fr + 36, 2);
    memcpy(h + 36, fr + 34, 2);
    store_be16(h + 38, (uint16_t)(8 + n));
    store_be16(h + 40, 0);
    store_be16(h + 16, (uint16_t)(28 + n));
}

/* worker_rewrite's row for one replica (Dataplane._egress), then the checksum. */
static void rewrite(uint8_t *h, const Replica *r) {
    memcpy(h, r->mac, 6);
    store_be32(h + 30, r->ip);
    store_be16(h + 36, r->udp);
    ipv4_checksum(h);
}

/* One frame in on port slot ps: the INA packet out[:n] to send (0: none; *to, *e as
 * process_one says), or PUNT with nothing read or written. */
static Py_ssize_t frame_one(FramePath *f, int ps, const uint8_t *fr, Py_ssize_t size,
                            uint8_t *out, int *to, const Entry **e) {
    Datapath *core = f->ports[ps].core;
    if (!core || size < INA_OFF || fr[12] != 0x08 || fr[13] != 0x00 || (fr[14] & 0x0F) != 5
        || fr[23] != 17 || load_be16(fr + 36) != f->udp_port)
        return PUNT;
    uint32_t dst = load_be32(fr + 30);
    int endpoint = 0;
    for (int i = 0; i < f->nendpoints && !endpoint; i++)
        endpoint = f->endpoints[i] == dst;
    Py_ssize_t udp_len = load_be16(fr + 38);
    if (!endpoint || udp_len < 8 || L4_OFF + udp_len > size)
        return PUNT;  /* forwarded, or malformed (Python counts it) */
    return process_one(core, fr + INA_OFF, udp_len - 8, load_be32(fr + 26), load_be16(fr + 34), out, to, e);
}

/* The replicas of a result: [first, first + count) of f->reps (checked: the cores' rows and
 * f->reps are set together, but a bad index must not read outside). */
static int replica_range(const FramePath *f, const Entry *e, uint32_t *first) {
    *first = e->dest_first;
    if (e->dest_first > (uint32_t)f->nreps)
        return 0;
    uint32_t left = (uint32_t)f->nreps - e->dest_first;
    return (int)(e->dest_count < left ? e->dest_count : left);
}

/* ------------------------------------------------------------------ sockets */
static void flush_port(FramePath *f, Port *p) {
    int off = 0, waited = 0;
    while (off < p->count) {
        int m = sendmmsg(p->fd, p->msg + off, (unsigned)(p->count - off), 0);
        if (m > 0) {
            for (int i = off; i < off + m; i++)
                f->bytes_out += p->iov[2 * i].iov_len + p->iov[2 * i + 1].iov_len;
            f->frames_out += (unsigned long long)m;
            off += m;
            waited = 0;
        } else if (m < 0 && errno == EINTR) {
            continue;
        } else if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !waited) {
            struct pollfd pfd = {.fd = p->fd, .events = POLLOUT};
            poll(&pfd, 1, 200);  /* as the UDP path: wait for room once */
            waited = 1;
        } else {
            f->send_errors++;
            off++;
            waited = 0;
        }
    }
    p->count = 0;
}

static void flush_all(FramePath *f) {
    for (int i = 0; i < f->nports; i++)
        if (f->ports[i].count)
            flush_port(f, &f->ports[i]);
    f->oused = 0;
}

/* A copy of the INA packet data[:n] to port slot s, with header h (INA_OFF bytes). */
static void queue_copy(FramePath *f, int s, const uint8_t *h, uint8_t *data, Py_ssize_t n) {
    Port *p = &f->ports[s];
    if (p->count == SEND_QUEUE)
        flush_port(f, p);
    int i = p->count++;
    uint8_t *head = p->heads + (Py_ssize_t)i * INA_OFF;
    memcpy(head, h, INA_OFF);
    p->iov[2 * i] = (struct iovec){.iov_base = head, .iov_len = INA_OFF};
    p->iov[2 * i + 1] = (struct iovec){.iov_base = data, .iov_len = (size_t)n};
    memset(&p->msg[i], 0, sizeof p->msg[i]);
    p->msg[i].msg_hdr.msg_iov = &p->iov[2 * i];
    p->msg[i].msg_hdr.msg_iovlen = 2;
}

static int frames_loop(FramePath *f, int ps, long budget, int *punt) {
    long done = 0;
    int errors = 0;
    for (;;) {
        if (f->rnext >= f->rcount) {
            flush_all(f);
            if (done >= budget)
                return SERVE_BUDGET;
            for (int i = 0; i < f->batch; i++)
                f->rmsg[i].msg_hdr.msg_namelen = sizeof f->raddr[i];
            long want = budget - done < f->batch ? budget - done : f->batch;  /* a turn's frames */
            int n = recvmmsg(f->ports[ps].fd, f->rmsg, (unsigned)want, MSG_DONTWAIT, NULL);
            if (n <= 0) {
                if (n < 0 && errno == EINTR)
                    continue;
                if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK || ++errors > 8)
                    return SERVE_IDLE;
                continue;
            }
            f->rcount = n;
            f->rnext = 0;
            f->rport = f->ports[ps].port;
        }
        int i = f->rnext++;
        if (f->raddr[i].sll_pkttype == PACKET_OUTGOING)
            continue;  /* our own transmission seen again (kernels before 4.20) */
        const uint8_t *fr = f->rbuf + (Py_ssize_t)i * FRAME_MAX;
        Py_ssize_t size = f->rmsg[i].msg_len;
        f->frames_in++;
        f->bytes_in += (unsigned long long)size;
        uint8_t *out = f->obuf + (Py_ssize_t)f->oused * f->out_len;
        int to = 0;
        const Entry *e = NULL;
        int s = f->slot_of[f->rport];  /* its slot now: the tables may change after a punt */
        Py_ssize_t n = s < 0 ? PUNT : frame_one(f, s, fr, size, out, &to, &e);
        if (n == PUNT) {
            flush_all(f);  /* what came before it leaves before Python answers it */
            *punt = i;
            return SERVE_PUNT;
        }
        done++;
        if (n <= 0)
            continue;
        f->oused++;
        uint8_t h[INA_OFF];
        reply_head(h, fr, n);
        if (to == TO_SENDER) {
            ipv4_checksum(h);
            if (f->ports[s].fd >= 0)
                queue_copy(f, s, h, out, n);
            continue;
        }
        uint32_t first;
        int count = replica_range(f, e, &first);
        for (int j = 0; j < count; j++) {
            const Replica *r = &f->reps[first + j];
            if (r->sock < 0)
                continue;  /* a port without a socket: the frame goes nowhere */
            rewrite(h, r);
            queue_copy(f, r->sock, h, out, n);
        }
    }
}

/* ------------------------------------------------------------------ Python type */
static void free_ports(FramePath *f) {
    for (int i = 0; i < f->nports; i++) {
        PyMem_Free(f->ports[i].msg);
        PyMem_Free(f->ports[i].iov);
        PyMem_Free(f->ports[i].heads);
    }
    PyMem_Free(f->ports);
    f->ports = NULL;
    f->nports = 0;
}

static void FramePath_dealloc(FramePath *f) {
    free_ports(f);
    Py_XDECREF(f->cores);
    PyMem_Free(f->endpoints);
    PyMem_Free(f->reps);
    PyMem_Free(f->rbuf);
    PyMem_Free(f->obuf);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *FramePath_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"slot_capacity", "ina_udp_port", "batch", NULL};
    Py_ssize_t cap;
    int udp_port, batch = BATCH;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ni|i", names, &cap, &udp_port, &batch))
        return NULL;
    if (cap <= 0 || udp_port < 0 || udp_port > 0xFFFF || batch < 1 || batch > BATCH) {
        PyErr_Format(PyExc_ValueError, "slot_capacity > 0, ina_udp_port 0..65535, batch 1..%d",
                     BATCH);
        return NULL;
    }
    FramePath *f = (FramePath *)type->tp_alloc(type, 0);
    if (!f)
        return NULL;
    f->udp_port = (uint16_t)udp_port;
    f->batch = batch;
    f->out_len = HEADER_LEN + 4 * MAX_LANES + 4 * cap;
    memset(f->slot_of, 0xFF, sizeof f->slot_of);
    f->rbuf = PyMem_Malloc((size_t)BATCH * FRAME_MAX);
    f->obuf = PyMem_Malloc((size_t)(BATCH + 1) * (size_t)f->out_len);
    if (!f->rbuf || !f->obuf) {
        Py_DECREF(f);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < BATCH; i++) {
        f->riov[i].iov_base = f->rbuf + (size_t)i * FRAME_MAX;
        f->riov[i].iov_len = FRAME_MAX;
        memset(&f->rmsg[i], 0, sizeof f->rmsg[i]);
        f->rmsg[i].msg_hdr.msg_name = &f->raddr[i];
        f->rmsg[i].msg_hdr.msg_iov = &f->riov[i];
        f->rmsg[i].msg_hdr.msg_iovlen = 1;
    }
    return (PyObject *)f;
}

PyDoc_STRVAR(frames_set_tables_doc,
"set_tables(ports, endpoints, replicas)\n\n"
"ports: (port, fd, core) of every port with a socket (fd, else -1) or admission rows (core: a\n"
"Datapath(-1, ...) on the Pipeline's arrays whose set_tables holds that ingress port's rows, their\n"
"destinations indexing `replicas`; else None). endpoints: the ina_endpoint IPv4 addresses as\n"
"ints. replicas: (egress port, MAC bytes, IPv4 int, UDP port) of each result copy.");

static PyObject *FramePath_set_tables(FramePath *f, PyObject *args) {
    PyObject *ports, *eps, *reps;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &ports, &PyList_Type, &eps, &PyList_Type,
                          &reps))
        return NULL;
    Py_ssize_t np = PyList_GET_SIZE(ports), ne = PyList_GET_SIZE(eps), nr = PyList_GET_SIZE(reps);
    if (np > PORT_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "more ports than v1model has");
        return NULL;
    }
    Port *pv = PyMem_Calloc(np ? (size_t)np : 1, sizeof *pv);
    uint32_t *ev = PyMem_Calloc(ne ? (size_t)ne : 1, sizeof *ev);
    Replica *rv = PyMem_Calloc(nr ? (size_t)nr : 1, sizeof *rv);
    PyObject *cores = PyList_New(0);
    int16_t slot_of[PORT_SLOTS];
    memset(slot_of, 0xFF, sizeof slot_of);
    Py_ssize_t done = 0;
    if (!pv || !ev || !rv || !cores) {
        PyErr_NoMemory();
        goto fail;
    }
    for (; done < np; done++) {
        PyObject *core;
        Port *p = &pv[done];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ports, done), "iiO", &p->port, &p->fd, &core))
            goto fail;
        if (p->port < 0 || p->port >= PORT_SLOTS || slot_of[p->port] >= 0) {
            PyErr_Format(PyExc_ValueError, "port %d: 0..%d, once", p->port, PORT_SLOTS - 1);
            goto fail;
        }
        if (core != Py_None) {
            if (!PyObject_TypeCheck(core, &DatapathType)) {
                PyErr_SetString(PyExc_TypeError, "a port's core must be a Datapath or None");
                goto fail;
            }
            if (((Datapath *)core)->out_len > f->out_len) {
                PyErr_SetString(PyExc_ValueError, "a core's slot capacity exceeds this one's");
                goto fail;
            }
            p->core = (Datapath *)core;
            if (PyList_Append(cores, core) < 0)
                goto fail;
        }
        p->msg = PyMem_Calloc(SEND_QUEUE, sizeof *p->msg);
        p->iov = PyMem_Calloc(2 * SEND_QUEUE, sizeof *p->iov);
        p->heads = PyMem_Malloc((size_t)SEND_QUEUE * INA_OFF);
        if (!p->msg || !p->iov || !p->heads) {
            PyErr_NoMemory();
            done++;
            goto fail;
        }
        slot_of[p->port] = (int16_t)done;
    }
    for (Py_ssize_t i = 0; i < ne; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PyList_GET_ITEM(eps, i));
        if (PyErr_Occurred() || v > 0xFFFFFFFFul) {
            PyErr_SetString(PyExc_ValueError, "an endpoint must be an IPv4 address as an int");
            goto fail;
        }
        ev[i] = (uint32_t)v;
    }
    for (Py_ssize_t i = 0; i < nr; i++) {
        const char *mac;
        Py_ssize_t maclen;
        unsigned int ip, udp;
        Replica *r = &rv[i];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(reps, i), "iy#II", &r->port, &mac, &maclen, &ip,
                              &udp))
            goto fail;
        if (maclen != 6 || udp > 0xFFFF) {
            PyErr_Format(PyExc_ValueError, "replica %zd: a 6-byte MAC and a UDP port", i);
            goto fail;
        }
        memcpy(r->mac, mac, 6);
        r->ip = ip;
        r->udp = (uint16_t)udp;
        int s = r->port >= 0 && r->port < PORT_SLOTS ? slot_of[r->port] : -1;
        r->sock = s >= 0 && pv[s].fd >= 0 ? s : -1;
    }
    free_ports(f);
    Py_XSETREF(f->cores, cores);
    PyMem_Free(f->endpoints);
    PyMem_Free(f->reps);
    f->ports = pv;
    f->nports = (int)np;
    memcpy(f->slot_of, slot_of, sizeof slot_of);
    f->endpoints = ev;
    f->nendpoints = (int)ne;
    f->reps = rv;
    f->nreps = (int)nr;
    Py_RETURN_NONE;
fail:
    for (Py_ssize_t i = 0; i < done && pv; i++) {
        PyMem_Free(pv[i].msg);
        PyMem_Free(pv[i].iov);
        PyMem_Free(pv[i].heads);
    }
    PyMem_Free(pv);
    PyMem_Free(ev);
    PyMem_Free(rv);
    Py_XDECREF(cores);
    return NULL;
}

/* (port, bytes) of one copy: header h and the INA packet data[:n]. */
static int append_copy(PyObject *list, int port, const uint8_t *h, const uint8_t *data,
                       Py_ssize_t n) {
    PyObject *b = PyBytes_FromStringAndSize(NULL, INA_OFF + n);
    if (!b)
        return -1;
    memcpy(PyBytes_AS_STRING(b), h, INA_OFF);
    memcpy(PyBytes_AS_STRING(b) + INA_OFF, data, (size_t)n);
    PyObject *t = Py_BuildValue("(iN)", port, b);
    if (!t || PyList_Append(list, t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    Py_DECREF(t);
    return 0;
}

PyDoc_STRVAR(frames_process_doc,
"process(frame, port) -> [(egress port, frame)] or None\n\n"
"One frame in on `port`, as Dataplane.process gives it on an idle traffic manager, without\n"
"sockets: the frames out (every replica, with or without a socket), or None if Python's\n"
"Dataplane must take it (nothing was read or written).");

static PyObject *FramePath_process(FramePath *f, PyObject *args) {
    Py_buffer fr;
    int port;
    if (!PyArg_ParseTuple(args, "y*i", &fr, &port))
        return NULL;
    PyObject *ret = NULL;
    int ps = port >= 0 && port < PORT_SLOTS ? f->slot_of[port] : -1;
    uint8_t *out = f->obuf + (Py_ssize_t)BATCH * f->out_len;  /* never a batch's */
    int to = 0;
    const Entry *e = NULL;
    Py_ssize_t n = ps < 0 ? PUNT : frame_one(f, ps, fr.buf, fr.len, out, &to, &e);
    if (n == PUNT) {
        ret = Py_NewRef(Py_None);
        goto done;
    }
    if (!(ret = PyList_New(0)) || n == 0)
        goto done;
    uint8_t h[INA_OFF];
    reply_head(h, fr.buf, n);
    if (to == TO_SENDER) {
        ipv4_checksum(h);
        if (append_copy(ret, port, h, out, n) < 0)
            Py_CLEAR(ret);
        goto done;
    }
    uint32_t first;
    int count = replica_range(f, e, &first);
    for (int j = 0; j < count; j++) {
        rewrite(h, &f->reps[first + j]);
        if (append_copy(ret, f->reps[first + j].port, h, out, n) < 0) {
            Py_CLEAR(ret);
            break;
        }
    }
done:
    PyBuffer_Release(&fr);
    return ret;
}

PyDoc_STRVAR(frames_serve_doc,
"serve(port, budget) -> (outcome, frame, port)\n\n"
"Serve frames waiting on `port`'s socket (the caller holds the pipeline's lock): outcome 0, none\n"
"left now; 1, `budget` frames served and more may wait; 2, `frame` from `port` is for Python's\n"
"Dataplane (every frame before it is served and its copies sent). A batch a punt cut short is\n"
"finished first, whatever `port` is asked for.");

static PyObject *FramePath_serve(FramePath *f, PyObject *args) {
    int port, punt = -1, outcome;
    long budget;
    if (!PyArg_ParseTuple(args, "il", &port, &budget))
        return NULL;
    int ps = port >= 0 && port < PORT_SLOTS ? f->slot_of[port] : -1;
    if (ps < 0 || f->ports[ps].fd < 0) {
        PyErr_Format(PyExc_ValueError, "port %d has no socket here", port);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    outcome = frames_loop(f, ps, budget, &punt);
    Py_END_ALLOW_THREADS
    if (outcome != SERVE_PUNT)
        return Py_BuildValue("(iOO)", outcome, Py_None, Py_None);
    return Py_BuildValue("(iy#i)", outcome, (const char *)f->rbuf + (Py_ssize_t)punt * FRAME_MAX,
                         (Py_ssize_t)f->rmsg[punt].msg_len, f->rport);
}

static PyObject *FramePath_stats(FramePath *f, PyObject *unused) {
    return Py_BuildValue("{sKsKsKsKsK}", "frames_in", f->frames_in, "bytes_in", f->bytes_in,
                         "frames_out", f->frames_out, "bytes_out", f->bytes_out,
                         "send_errors", f->send_errors);
}

static PyMethodDef FramePath_methods[] = {
    {"set_tables", (PyCFunction)FramePath_set_tables, METH_VARARGS, frames_set_tables_doc},
    {"process", (PyCFunction)FramePath_process, METH_VARARGS, frames_process_doc},
    {"serve", (PyCFunction)FramePath_serve, METH_VARARGS, frames_serve_doc},
    {"stats", (PyCFunction)FramePath_stats, METH_NOARGS,
     "stats() -> the frames and bytes received and sent here, and failed sends"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject FramePathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "softswitch._datapath.FramePath",
    .tp_basicsize = sizeof(FramePath),
    .tp_dealloc = (destructor)FramePath_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FramePath(slot_capacity, ina_udp_port, batch=BATCH): the L2 mode's compiled\n"
              "frames around per-ingress-port core Datapaths (softswitch/compiled_frames.py).",
    .tp_methods = FramePath_methods,
    .tp_new = FramePath_new,
};
