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

/* op g completes at t: its dependents start no earlier, and those with no dependency left
   join the work list (returns its new length) */
static inline Py_ssize_t finish(int64_t g, double t, double *done, double *ready_at, int64_t *remaining,
                                const int64_t *dep_ptr, const int64_t *dep_idx, int64_t *work, Py_ssize_t nwork) {
    done[g] = t;
    for (int64_t k = dep_ptr[g]; k < dep_ptr[g + 1]; k++) {
        int64_t d = dep_idx[k];
        if (t > ready_at[d]) ready_at[d] = t;
        if (--remaining[d] == 0) work[nwork++] = d;
    }
    return nwork;
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
    /* the arguments in the order of the module docstring, grouped by element type */
    const int8_t *code = b[0].buf;
    const int64_t *partner = b[2].buf, *dep_ptr = b[3].buf, *dep_idx = b[4].buf, *nbytes_of = b[6].buf,
                  *route_of = b[7].buf, *route_ptr = b[8].buf, *route_links = b[9].buf;
    const double *local_s = b[1].buf, *route_cmin = b[10].buf, *lat = b[11].buf, *cap = b[12].buf;
    int64_t *remaining = b[5].buf, *link_bytes = b[16].buf;
    double *done = b[13].buf, *link_free = b[14].buf, *link_busy = b[15].buf, *link_first = b[17].buf;
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
                nwork = finish(g, t + local_s[g], done, ready_at, remaining, dep_ptr, dep_idx, work, nwork);
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
        nwork = finish(s, end, done, ready_at, remaining, dep_ptr, dep_idx, work, nwork);
        nwork = finish(r, end + local_s[r], done, ready_at, remaining, dep_ptr, dep_idx, work, nwork);
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


static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS, "the simulator's event loop over flat arrays (compiler/cost.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.compiler._simcore",
                                       "the simulator's event loop (compiler/cost.py)", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) { return PyModule_Create(&moduledef); }
