/* hcc.compiler._simcore — the event loop of compiler/cost.py's simulator over flat arrays.

   It runs exactly the loop of cost._simulate_py (the reference, kept in Python): the same
   FIFO of ops whose dependencies completed, the same heap of ready messages ordered by
   (ready time, sequence number), the same per-hop reservations, in the same floating-point
   operations in the same order (built with -ffp-contract=off, so no fused multiply-add
   changes a rounding), so both give bit-identical predictions. Everything the loop reads
   is prepared by compiler/compact.py; everything it decides stays there and in cost.py
   (style.md habit 16: a native core runs what it is given).

   simulate(code, local_s, partner, dep_ptr, dep_idx, remaining, nbytes, route,
            route_ptr, route_links, route_cmin, lat, cap, per_msg,
            done, link_free, link_busy, link_bytes, link_first) -> (messages, wire_bytes)

   code[g]: 0 send, 1 recv, 2 recv-reduce, 3 local (int8); local_s[g]: a local op's or a
   receive's combine duration; partner[g]: the matching op of a message op (int64);
   dep_ptr/dep_idx: op g's dependents are dep_idx[dep_ptr[g]:dep_ptr[g+1]] (int64 CSR);
   remaining[g]: its dependency count (int64, consumed); nbytes[g], route[g]: a send's wire
   bytes (int64) and route id (int64); route r's links are route_links[route_ptr[r]:
   route_ptr[r+1]] and its bottleneck capacity route_cmin[r]; lat/cap per link. Outputs:
   done[g] (-1 for ops that never ran) and the per-link figures, preset by the caller. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    double t;
    int64_t seq;
    int64_t s;
} Entry;

/* a binary min-heap on (t, seq): seq is unique, so the order is total, as in Python */
static inline int less(const Entry *a, const Entry *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(Entry **h, Py_ssize_t *n, Py_ssize_t *cap, Entry e) {
    if (*n == *cap) {
        Py_ssize_t nc = *cap ? *cap * 2 : 1024;
        Entry *nh = realloc(*h, (size_t)nc * sizeof(Entry));
        if (!nh) return -1;
        *h = nh;
        *cap = nc;
    }
    Entry *a = *h;
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!less(&e, &a[p])) break;
        a[i] = a[p];
        i = p;
    }
    a[i] = e;
    return 0;
}

static Entry heap_pop(Entry *a, Py_ssize_t *n) {
    Entry top = a[0];
    Entry last = a[--(*n)];
    Py_ssize_t i = 0, m = *n;
    for (;;) {
        Py_ssize_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && less(&a[c + 1], &a[c])) c++;
        if (!less(&a[c], &last)) break;
        a[i] = a[c];
        i = c;
    }
    if (m > 0) a[i] = last;
    return top;
}

#define NBUF 19

static PyObject *simulate(PyObject *self, PyObject *args) {
    Py_buffer b[NBUF];
    double per_msg;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*y*y*y*y*y*y*y*dw*w*w*w*w*", &b[0], &b[1], &b[2], &b[3], &b[4],
                          &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &per_msg, &b[13],
                          &b[14], &b[15], &b[16], &b[17]))
        return NULL;
    const int8_t *code = b[0].buf;
    const double *local_s = b[1].buf;
    const int64_t *partner = b[2].buf;
    const int64_t *dep_ptr = b[3].buf;
    const int64_t *dep_idx = b[4].buf;
    int64_t *remaining = b[5].buf;
    const int64_t *nbytes_of = b[6].buf;
    const int64_t *route_of = b[7].buf;
    const int64_t *route_ptr = b[8].buf;
    const int64_t *route_links = b[9].buf;
    const double *route_cmin = b[10].buf;
    const double *lat = b[11].buf;
    const double *cap = b[12].buf;
    double *done = b[13].buf;
    double *link_free = b[14].buf;
    double *link_busy = b[15].buf;
    int64_t *link_bytes = b[16].buf;
    double *link_first = b[17].buf;
    Py_ssize_t total = b[0].len;
    int64_t messages = 0, wire_total = 0;
    PyObject *result = NULL;

    double *posted = malloc((size_t)(total ? total : 1) * sizeof(double));
    double *ready_at = malloc((size_t)(total ? total : 1) * sizeof(double));
    int64_t *work = malloc((size_t)(total ? total : 1) * sizeof(int64_t));
    Entry *heap = NULL;
    Py_ssize_t hn = 0, hcap = 0;
    int oom = 0;
    if (!posted || !ready_at || !work) {
        PyErr_NoMemory();
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t nwork = 0, head = 0;
    int64_t seq = 0;
    for (Py_ssize_t g = 0; g < total; g++) {
        posted[g] = -1.0;
        ready_at[g] = 0.0;
        if (remaining[g] == 0) work[nwork++] = g;
    }
    for (;;) {
        while (head < nwork) {
            int64_t g = work[head++];
            double t = ready_at[g];
            int c = code[g];
            if (c == 3) {
                t += local_s[g];
                done[g] = t;
                for (int64_t k = dep_ptr[g]; k < dep_ptr[g + 1]; k++) {
                    int64_t d = dep_idx[k];
                    if (t > ready_at[d]) ready_at[d] = t;
                    if (--remaining[d] == 0) work[nwork++] = d;
                }
                continue;
            }
            posted[g] = t;
            int64_t p = partner[g];
            double tp = posted[p];
            if (tp >= 0.0) {
                Entry e = {t > tp ? t : tp, seq++, c == 0 ? g : p};
                if (heap_push(&heap, &hn, &hcap, e)) {
                    oom = 1;
                    break;
                }
            }
        }
        if (oom) break;
        /* every op enters the work list once: restarting it at 0 reuses the array */
        nwork = 0;
        head = 0;
        if (hn == 0) break;
        Entry top = heap_pop(heap, &hn);
        double ready = top.t;
        int64_t s = top.s, r = partner[s];
        int64_t nb = nbytes_of[s];
        int64_t rt = route_of[s];
        int64_t h0 = route_ptr[rt], h1 = route_ptr[rt + 1];
        double fnb = (double)nb;
        double stream = h1 > h0 ? fnb / route_cmin[rt] : 0.0;
        double t_hop = ready;
        double end = ready + per_msg;
        for (int64_t k = h0; k < h1; k++) {
            int64_t e = route_links[k];
            if (link_free[e] > t_hop) t_hop = link_free[e];
            double fixed = lat[e] + per_msg;
            double inv = 1.0 / cap[e];
            double hold = fixed + fnb * inv;
            if (link_first[e] < 0.0) link_first[e] = t_hop;
            link_free[e] = t_hop + hold;
            link_busy[e] += hold;
            link_bytes[e] += nb;
            t_hop += lat[e];
            double fin = t_hop + per_msg + stream;
            if (fin > end) end = fin;
        }
        messages++;
        wire_total += nb;
        for (int side = 0; side < 2; side++) {
            int64_t g = side ? r : s;
            double t = side ? end + local_s[r] : end;
            done[g] = t;
            for (int64_t k = dep_ptr[g]; k < dep_ptr[g + 1]; k++) {
                int64_t d = dep_idx[k];
                if (t > ready_at[d]) ready_at[d] = t;
                if (--remaining[d] == 0) work[nwork++] = d;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("LL", (long long)messages, (long long)wire_total);
out:
    free(posted);
    free(ready_at);
    free(work);
    free(heap);
    for (int i = 0; i < NBUF; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}


/* extract(ops, classes, code, ndeps, peer, tag, tree, count) -> bytes of the deps, flat int64

   One pass over the plan's ops (a list), each object touched once while it is in cache:
   code[g] = the index of type(op) in ``classes`` (-1: none of them); ndeps[g]; and for the
   message ops (the first three classes: Send, Recv, RecvReduce) peer, tag, tree; count[g]
   = src.count for the first class (Send), dst.count for the others. A field of the wrong
   type raises TypeError (the caller then leaves the plan to the reference simulator). */
static int64_t get_int(PyObject *o, PyObject *name, int *err) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (!v) {
        *err = 1;
        return 0;
    }
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred()) *err = 1;
    return (int64_t)x;
}

static PyObject *extract(PyObject *self, PyObject *args) {
    PyObject *ops, *classes;
    Py_buffer b[6];
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "O!O!w*w*w*w*w*w*", &PyList_Type, &ops, &PyTuple_Type, &classes, &b[0], &b[1],
                          &b[2], &b[3], &b[4], &b[5]))
        return NULL;
    static PyObject *s_deps, *s_peer, *s_tag, *s_tree, *s_src, *s_dst, *s_count;
    if (!s_deps) {
        s_deps = PyUnicode_InternFromString("deps");
        s_peer = PyUnicode_InternFromString("peer");
        s_tag = PyUnicode_InternFromString("tag");
        s_tree = PyUnicode_InternFromString("tree");
        s_src = PyUnicode_InternFromString("src");
        s_dst = PyUnicode_InternFromString("dst");
        s_count = PyUnicode_InternFromString("count");
    }
    int8_t *code = b[0].buf;
    int64_t *ndeps = b[1].buf, *peer = b[2].buf, *tag = b[3].buf, *tree = b[4].buf, *count = b[5].buf;
    Py_ssize_t total = PyList_GET_SIZE(ops), ncls = PyTuple_GET_SIZE(classes);
    Py_ssize_t dcap = total + 16, dn = 0;
    int64_t *flat = malloc((size_t)dcap * sizeof(int64_t));
    PyObject *result = NULL;
    int err = 0;
    if (!flat) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t g = 0; g < total && !err; g++) {
        PyObject *op = PyList_GET_ITEM(ops, g);
        int k = -1;
        for (Py_ssize_t c = 0; c < ncls; c++)
            if ((PyObject *)Py_TYPE(op) == PyTuple_GET_ITEM(classes, c)) {
                k = (int)c;
                break;
            }
        code[g] = (int8_t)k;
        if (k < 0) {
            ndeps[g] = 0;
            continue;
        }
        PyObject *deps = PyObject_GetAttr(op, s_deps);
        if (!deps) {
            err = 1;
            break;
        }
        PyObject *fast = PySequence_Fast(deps, "deps must be a sequence");
        Py_DECREF(deps);
        if (!fast) {
            err = 1;
            break;
        }
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(fast);
        if (dn + nd > dcap) {
            Py_ssize_t nc = (dn + nd) * 2;
            int64_t *nf = realloc(flat, (size_t)nc * sizeof(int64_t));
            if (!nf) {
                Py_DECREF(fast);
                PyErr_NoMemory();
                err = 1;
                break;
            }
            flat = nf;
            dcap = nc;
        }
        for (Py_ssize_t i = 0; i < nd; i++) {
            long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
            if (x == -1 && PyErr_Occurred()) {
                err = 1;
                break;
            }
            flat[dn++] = (int64_t)x;
        }
        Py_DECREF(fast);
        ndeps[g] = nd;
        if (err) break;
        if (k < 3) {
            peer[g] = get_int(op, s_peer, &err);
            tag[g] = get_int(op, s_tag, &err);
            tree[g] = get_int(op, s_tree, &err);
        } else {
            peer[g] = tag[g] = tree[g] = -1;
        }
        PyObject *ref = PyObject_GetAttr(op, k == 0 ? s_src : s_dst);
        if (!ref) {
            err = 1;
            break;
        }
        count[g] = get_int(ref, s_count, &err);
        Py_DECREF(ref);
    }
    if (!err) result = PyBytes_FromStringAndSize((const char *)flat, (Py_ssize_t)(dn * sizeof(int64_t)));
out:
    free(flat);
    for (int i = 0; i < 6; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS, "the simulator's event loop over flat arrays (compiler/cost.py)"},
    {"extract", extract, METH_VARARGS, "the fields of a plan's ops as flat arrays (compiler/compact.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.compiler._simcore",
                                       "the simulator's event loop (compiler/cost.py)", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) { return PyModule_Create(&moduledef); }
