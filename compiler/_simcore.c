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


/* ---- the timed lowering's list schedule (compiler/schedule.py, _Timed.schedule) ----------

   wfq(port, path_ptr, path_links, nbytes, key, down, dep_ptr, dep_idx, remaining, src, dst,
       port_rank, wsize, gated, lat, cap, per_msg, gate, push_comp, nranks,
       order, pred, start, end) -> (started, makespan)

   Runs exactly the loop of schedule._Timed._schedule_py (the reference, kept in Python):
   the same event heap on (time, phase, sequence number), the same per-port queues on (key,
   up before down, later message first), the same port windows, completion gates and per-hop
   reservations in the same floating-point operations, so both give the same order, the same
   window predecessors and bit-identical times. Per message m: port[m] its first link, its
   links path_links[path_ptr[m]:path_ptr[m+1]], nbytes[m] its bytes (double, exact), key[m],
   down[m] (int8), src/dst ranks; dependents of m: dep_idx[dep_ptr[m]:dep_ptr[m+1]] in
   increasing order, remaining[m] its dependency count (consumed). Per link used as a port:
   port_rank (its sender), wsize (its window), gated (int8: starts wait for a completion at
   its rank). gate: gating on at all; push_comp: completions recorded per rank. Outputs per
   message: order (start position -> message), pred (-1 or the message wsize starts
   earlier on its port), start, end. */

/* a heap item ordered by (k, a, b); the event heap's are (time, phase, sequence number, what),
   a port queue's (key, not down, -m, m) */
typedef struct {
    double k;
    int64_t a, b, x;
} Item;

static inline int item_less(const Item *p, const Item *q) {
    if (p->k != q->k) return p->k < q->k;
    if (p->a != q->a) return p->a < q->a;
    return p->b < q->b;
}

/* one generic binary min-heap: elements of `size` bytes, ordered by `lt` */
typedef struct {
    char *a;
    Py_ssize_t n, cap;
} Heap;

#define HEAP_FUNCS(NAME, T, LT)                                                                    \
    static int NAME##_push(Heap *h, T e) {                                                        \
        if (h->n == h->cap) {                                                                     \
            Py_ssize_t nc = h->cap ? h->cap * 2 : 16;                                             \
            char *na = realloc(h->a, (size_t)nc * sizeof(T));                                     \
            if (!na) return -1;                                                                   \
            h->a = na;                                                                            \
            h->cap = nc;                                                                          \
        }                                                                                         \
        T *a = (T *)h->a;                                                                         \
        Py_ssize_t i = h->n++;                                                                    \
        while (i > 0) {                                                                           \
            Py_ssize_t p = (i - 1) / 2;                                                           \
            if (!LT(&e, &a[p])) break;                                                            \
            a[i] = a[p];                                                                          \
            i = p;                                                                                \
        }                                                                                         \
        a[i] = e;                                                                                 \
        return 0;                                                                                 \
    }                                                                                             \
    static T NAME##_pop(Heap *h) {                                                                \
        T *a = (T *)h->a;                                                                         \
        T top = a[0];                                                                             \
        T last = a[--h->n];                                                                       \
        Py_ssize_t i = 0, m = h->n;                                                               \
        for (;;) {                                                                                \
            Py_ssize_t c = 2 * i + 1;                                                             \
            if (c >= m) break;                                                                    \
            if (c + 1 < m && LT(&a[c + 1], &a[c])) c++;                                           \
            if (!LT(&a[c], &last)) break;                                                         \
            a[i] = a[c];                                                                          \
            i = c;                                                                                \
        }                                                                                         \
        if (m > 0) a[i] = last;                                                                   \
        return top;                                                                               \
    }

static inline int d_less(const double *a, const double *b) { return *a < *b; }

HEAP_FUNCS(ih, Item, item_less)
HEAP_FUNCS(dh, double, d_less)

#define NWFQ 20

static PyObject *wfq(PyObject *self, PyObject *args) {
    Py_buffer b[NWFQ];
    double per_msg;
    int gate, push_comp;
    Py_ssize_t nranks;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*w*y*y*y*y*y*y*y*dppnw*w*w*w*", &b[0], &b[1], &b[2], &b[3],
                          &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14],
                          &b[15], &per_msg, &gate, &push_comp, &nranks, &b[16], &b[17], &b[18], &b[19]))
        return NULL;
    const int64_t *port = b[0].buf, *path_ptr = b[1].buf, *path_links = b[2].buf, *dep_ptr = b[6].buf,
                  *dep_idx = b[7].buf, *src = b[9].buf, *dst = b[10].buf, *port_rank = b[11].buf,
                  *wsize = b[12].buf;
    const double *nbytes = b[3].buf, *key = b[4].buf, *lat = b[14].buf, *cap = b[15].buf;
    const int8_t *down = b[5].buf, *gated = b[13].buf;
    int64_t *remaining = b[8].buf, *order = b[16].buf, *pred = b[17].buf;
    double *t_start = b[18].buf, *t_end = b[19].buf;
    Py_ssize_t nm = b[0].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t nl = b[14].len / (Py_ssize_t)sizeof(double);
    PyObject *result = NULL;
    int oom = 0;
    Py_ssize_t norder = 0;
    double makespan = 0.0;

    Heap ev = {0};
    Heap *queue = calloc((size_t)(nl ? nl : 1), sizeof(Heap));
    Heap *comp = calloc((size_t)(nranks ? nranks : 1), sizeof(Heap));
    double *link_free = calloc((size_t)(nl ? nl : 1), sizeof(double));
    double *nxt = calloc((size_t)(nl ? nl : 1), sizeof(double));
    /* per port a ring of its last wsize starts: (message, end) */
    int64_t *win_off = calloc((size_t)(nl + 1), sizeof(int64_t));
    int64_t *win_head = calloc((size_t)(nl ? nl : 1), sizeof(int64_t));
    int64_t *win_len = calloc((size_t)(nl ? nl : 1), sizeof(int64_t));
    int64_t *win_m = NULL;
    double *win_e = NULL;
    if (!queue || !comp || !link_free || !nxt || !win_off || !win_head || !win_len) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t x = 0; x < nl; x++) win_off[x + 1] = win_off[x] + (port_rank[x] >= 0 ? wsize[x] : 0);
    win_m = malloc((size_t)(win_off[nl] ? win_off[nl] : 1) * sizeof(int64_t));
    win_e = malloc((size_t)(win_off[nl] ? win_off[nl] : 1) * sizeof(double));
    if (!win_m || !win_e) {
        PyErr_NoMemory();
        goto out;
    }
    Py_BEGIN_ALLOW_THREADS
    int64_t seq = 0;
#define READY(M, T)                                                                                \
    do {                                                                                           \
        int64_t m_ = (M), x_ = port[m_];                                                           \
        double t_ = (T), a_ = nxt[x_];                                                             \
        Item q_ = {key[m_], !down[m_], -m_, m_};                                                   \
        Item e_ = {t_ >= a_ ? t_ : a_, 1, seq++, x_};                                              \
        if (ih_push(&queue[x_], q_) || ih_push(&ev, e_)) oom = 1;                                  \
    } while (0)
    for (Py_ssize_t m = 0; m < nm && !oom; m++)
        if (remaining[m] == 0) READY(m, 0.0);
    while (ev.n > 0 && !oom) {
        Item top = ih_pop(&ev);
        double t = top.k;
        int64_t x = top.x;
        if (top.a == 0) {
            for (int64_t k = dep_ptr[x]; k < dep_ptr[x + 1] && !oom; k++) {
                int64_t d = dep_idx[k];
                if (--remaining[d] == 0) READY(d, t);
            }
            continue;
        }
        Heap *q = &queue[x];
        if (q->n == 0 || t < nxt[x] - 1e-15) continue;
        if (gate && t > 0.0 && gated[x]) {
            Heap *c = &comp[port_rank[x]];
            while (c->n && ((double *)c->a)[0] < t - 1e-12) dh_pop(c);
            if (c->n && ((double *)c->a)[0] > t + 1e-12) {
                Item e = {((double *)c->a)[0], 1, seq++, x};
                if (ih_push(&ev, e)) oom = 1;
                continue;
            }
        }
        int64_t m = ih_pop(q).x;
        int64_t w = wsize[x], *wm = win_m + win_off[x];
        double *we = win_e + win_off[x];
        pred[m] = win_len[x] == w ? wm[win_head[x]] : -1;
        double nb = nbytes[m];
        int64_t h0 = path_ptr[m], h1 = path_ptr[m + 1];
        double cmin = cap[path_links[h0]];
        for (int64_t k = h0 + 1; k < h1; k++)
            if (cap[path_links[k]] < cmin) cmin = cap[path_links[k]];
        double stream = nb / cmin;
        double t_hop = t;
        double end = t + per_msg;
        for (int64_t k = h0; k < h1; k++) {
            int64_t e = path_links[k];
            if (link_free[e] > t_hop) t_hop = link_free[e];
            link_free[e] = t_hop + lat[e] + per_msg + nb / cap[e];
            t_hop += lat[e];
            if (t_hop + per_msg + stream > end) end = t_hop + per_msg + stream;
        }
        order[norder++] = m;
        t_start[m] = t;
        t_end[m] = end;
        if (push_comp && (dh_push(&comp[src[m]], end) || dh_push(&comp[dst[m]], end))) oom = 1;
        if (win_len[x] == w) { /* popleft */
            win_head[x] = (win_head[x] + 1) % w;
            win_len[x]--;
        }
        int64_t slot = (win_head[x] + win_len[x]) % w;
        wm[slot] = m;
        we[slot] = end;
        win_len[x]++;
        double allow = win_len[x] == w ? we[win_head[x]] : 0.0;
        nxt[x] = allow >= link_free[x] ? allow : link_free[x];
        Item done = {end, 0, seq++, m};
        if (ih_push(&ev, done)) oom = 1;
        if (end > makespan) makespan = end;
        if (q->n) {
            Item again = {nxt[x], 1, seq++, x};
            if (ih_push(&ev, again)) oom = 1;
        }
    }
#undef READY
    Py_END_ALLOW_THREADS
    if (oom) {
        PyErr_NoMemory();
        goto out;
    }
    result = Py_BuildValue("nd", norder, makespan);
out:
    if (queue)
        for (Py_ssize_t x = 0; x < nl; x++) free(queue[x].a);
    if (comp)
        for (Py_ssize_t r = 0; r < nranks; r++) free(comp[r].a);
    void *owned[] = {queue, comp, ev.a, link_free, nxt, win_off, win_head, win_len, win_m, win_e};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) free(owned[i]);
    for (int i = 0; i < NWFQ; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS, "the simulator's event loop over flat arrays (compiler/cost.py)"},
    {"wfq", wfq, METH_VARARGS, "the timed lowering's list schedule over flat arrays (compiler/schedule.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.compiler._simcore",
                                       "the simulator's event loop (compiler/cost.py)", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) { return PyModule_Create(&moduledef); }
