/* hcc.compiler._simcore — the event loop of compiler/cost.py's simulator over flat arrays,
   and the timed lowering's two list schedules (compiler/schedule.py: wfq and exact, each
   documented at its section below).

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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
   down before up, later message first), the same port windows, completion gates and per-hop
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

/* an array of `size`-byte elements grown to twice its capacity (16 at first): the new array,
   *cap updated, or NULL (the old one kept) */
static void *grow(void *a, Py_ssize_t *cap, size_t size) {
    Py_ssize_t nc = *cap ? *cap * 2 : 16;
    void *na = realloc(a, (size_t)nc * size);
    if (na) *cap = nc;
    return na;
}

/* one generic binary min-heap: elements of `size` bytes, ordered by `lt` */
typedef struct {
    char *a;
    Py_ssize_t n, cap;
} Heap;

#define HEAP_FUNCS(NAME, T, LT)                                                                    \
    static int NAME##_push(Heap *h, T e) {                                                        \
        if (h->n == h->cap) {                                                                     \
            char *na = grow(h->a, &h->cap, sizeof(T));                                            \
            if (!na) return -1;                                                                   \
            h->a = na;                                                                            \
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

/* ---- the exact (switch) list schedule (compiler/schedule.py, _Timed.schedule_exact) ------

   exact(port, path_ptr, path_links, nbytes, key, down, dep_ptr, dep_idx, remaining, src,
         dst, rep, upz, avgroot, port_rank, wsize, lat, cap, per_msg, nranks,
         order, pred, start, end, pop, gate_z, gate_side, first_in)
       -> (started, makespan, ungated)

   Runs exactly the loop of schedule._Timed._schedule_exact_py (the reference, kept in
   Python): the same event heap on (time, phase, sequence number), the same per-port queues
   on (key, down before up, later message first), the same windows, the same choice of the
   completion that gates a start (or the time to wait for), the same order among the starts
   of one instant (the simulator's pop order, _sim_key), and the per-hop reservations in the
   simulator's floating-point operations in the same order, so both give the same order,
   predecessors, gates and bit-identical times. Per message m (int64 unless said): port[m]
   its first link; its links path_links[path_ptr[m]:path_ptr[m+1]]; nbytes[m] (double,
   exact); key[m] (double); down[m] (int8); dependents dep_idx[dep_ptr[m]:dep_ptr[m+1]] in
   increasing order, remaining[m] its dependency count (consumed); src/dst ranks; rep[m]: for
   an up message the first message of its chunk into the same rank (the key of first_in),
   else -1; upz[m]: for a down message of an allreduce the up message its receiver sends in
   the same job and chunk, else -1; avgroot[m] (int8): an avg allreduce's root sends it
   (its Send waits for the Scale). Per link: port_rank (its sender, -1 when no message
   starts on it), wsize (its window). Outputs per message: order (start position ->
   message), pred (-1 or the message wsize starts earlier on its port), start, end, pop (its
   start position), gate_z/gate_side (the message whose completion gated its start and the
   side, 0 sender, 1 receiver; gate_z -1: none), first_in[rep] (the first up message started
   into that rank and chunk, -1 if none). Every output is set here: the caller may pass
   uninitialised arrays. */

/* a completion at a rank: (end, message), kept sorted per rank */
typedef struct {
    double e;
    int64_t m;
} Done;

typedef struct {
    Done *a;
    Py_ssize_t head, n, cap; /* live entries a[head:n] */
} Comps;

static inline int done_le(const Done *p, double e, int64_t m) { return p->e < e || (p->e == e && p->m <= m); }

/* the first live index whose end is above v (bisect_right on (v, +inf)) */
static Py_ssize_t comps_above(const Comps *c, double v) {
    Py_ssize_t lo = c->head, hi = c->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (c->a[mid].e <= v) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* drop the completions before t (bisect_left on (t, -1)) */
static void comps_drop(Comps *c, double t) {
    Py_ssize_t lo = c->head, hi = c->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (c->a[mid].e < t) lo = mid + 1;
        else hi = mid;
    }
    c->head = lo;
}

/* insort_right of (e, m) */
static int comps_insert(Comps *c, double e, int64_t m) {
    if (c->n == c->cap) {
        if (c->head > 0) {
            memmove(c->a, c->a + c->head, (size_t)(c->n - c->head) * sizeof(Done));
            c->n -= c->head;
            c->head = 0;
        }
        if (c->n == c->cap) {
            Done *na = grow(c->a, &c->cap, sizeof(Done));
            if (!na) return -1;
            c->a = na;
        }
    }
    Py_ssize_t lo = c->head, hi = c->n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (done_le(&c->a[mid], e, m)) lo = mid + 1;
        else hi = mid;
    }
    memmove(c->a + lo + 1, c->a + lo, (size_t)(c->n - lo) * sizeof(Done));
    c->a[lo].e = e;
    c->a[lo].m = m;
    c->n++;
    return 0;
}

/* a start decided for one instant: port x, message m, its gate, its simulator key */
typedef struct {
    int64_t k[4];
    int64_t x, m, gz;
    int gs;
} Go;

static inline int key_cmp(const int64_t *p, const int64_t *q) {
    for (int i = 0; i < 4; i++)
        if (p[i] != q[i]) return p[i] < q[i] ? -1 : 1;
    return 0;
}

static inline void key_max(int64_t *best, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t k[4] = {a, b, c, d};
    if (key_cmp(k, best) > 0) memcpy(best, k, sizeof(k));
}

static int go_cmp(const void *p, const void *q) {
    const Go *a = p, *b = q;
    int c = key_cmp(a->k, b->k);
    if (c) return c;
    return (a->x > b->x) - (a->x < b->x);
}

static int i64_cmp(const void *p, const void *q) {
    int64_t a = *(const int64_t *)p, b = *(const int64_t *)q;
    return (a > b) - (a < b);
}

/* the state of one run of exact() */
typedef struct {
    Py_ssize_t nm, nl, nranks;
    const int64_t *port, *path_ptr, *path_links, *dep_ptr, *dep_idx, *src, *dst, *rep, *upz, *port_rank, *wsize;
    const double *nbytes, *key, *lat, *cap;
    const int8_t *down, *avgroot;
    double per_msg;
    int64_t *remaining, *order, *pred, *pop, *gate_z, *first_in;
    int8_t *gate_side;
    double *t_start, *t_end;
    /* working state */
    Heap ev, *queue;
    Comps *comp;
    double *link_free, *allow, *last, *stream;
    int8_t *has_last, *has_deps;
    int64_t *maxdep, *win_off, *win_head, *win_len, *win_m;
    double *win_e;
    int64_t seq, norder, ungated;
    double makespan;
} Exact;

/* _sim_key: where cost.simulate puts message m among the messages ready at one instant */
static void sim_key(const Exact *S, int64_t x, int64_t m, int64_t gz, int gs, int64_t *out) {
    int64_t s = S->src[m], d = S->dst[m];
    int64_t best[4] = {-1, 0, s, 0};
    if (S->has_deps[m]) key_max(best, S->maxdep[m], S->avgroot[m] ? 2 : 1, 0, 0);
    if (S->win_len[x] == S->wsize[x]) key_max(best, S->pop[S->win_m[S->win_off[x] + S->win_head[x]]], 0, 0, 0);
    if (gz >= 0 && gs == 0) key_max(best, S->pop[gz], S->src[gz] == s ? 0 : 1, 0, 0);
    int64_t recv[4];
    if (S->down[m]) {
        int64_t z = S->upz[m];
        if (z >= 0) {
            recv[0] = S->pop[z], recv[1] = 0, recv[2] = 0, recv[3] = 0;
        } else {
            recv[0] = -1, recv[1] = 0, recv[2] = d, recv[3] = 0;
        }
    } else {
        int64_t f = S->first_in[S->rep[m]];
        recv[0] = -1, recv[1] = 1, recv[2] = d, recv[3] = f >= 0 ? S->pop[f] : S->nm;
    }
    if (gz >= 0 && gs == 1) key_max(recv, S->pop[gz], S->src[gz] == d ? 0 : 1, 0, 0);
    key_max(best, recv[0], recv[1], recv[2], recv[3]);
    memcpy(out, best, sizeof(best));
}

/* decide: 1 go (the gate in *gz, *gs; *gz -1: none), 0 wait until *wait */
static int decide(Exact *S, int64_t x, int64_t m, double t, int64_t *gz, int *gs, double *wait) {
    *gz = -1;
    *gs = 0;
    if (t == 0.0 && !S->has_last[x]) return 1; /* everything without dependencies is posted at 0 */
    Comps *c2[2] = {&S->comp[S->port_rank[x]], &S->comp[S->dst[m]]};
    comps_drop(c2[0], t);
    comps_drop(c2[1], t);
    int64_t nz = -1;
    int ns = 0;
    if (!(S->has_last[x] && S->last[x] == t)) {
        for (int i = 0; i < 2; i++) {
            Comps *c = c2[i];
            if (c->n > c->head && c->a[c->head].e == t) {
                nz = c->a[c->head].m;
                ns = i;
                break;
            }
        }
    }
    /* the latest completion after t while the port is still busy */
    double busy = S->link_free[x], later = -1.0;
    for (int i = 0; i < 2; i++) {
        Py_ssize_t j = comps_above(c2[i], busy) - 1;
        if (j >= c2[i]->head && c2[i]->a[j].e > t && c2[i]->a[j].e > later) later = c2[i]->a[j].e;
    }
    if (later > t) {
        *wait = later;
        return 0;
    }
    if (nz >= 0) {
        *gz = nz;
        *gs = ns;
        return 1;
    }
    double nxt = INFINITY;
    for (int i = 0; i < 2; i++) {
        Py_ssize_t j = comps_above(c2[i], t);
        if (j < c2[i]->n && c2[i]->a[j].e < nxt) nxt = c2[i]->a[j].e;
    }
    if (nxt < INFINITY) {
        *wait = nxt;
        return 0;
    }
    S->ungated++;
    return 1;
}

static int exact_start(Exact *S, int64_t x, int64_t m, double t, int64_t gz, int gs) {
    ih_pop(&S->queue[x]);
    int64_t w = S->wsize[x], *wm = S->win_m + S->win_off[x];
    double *we = S->win_e + S->win_off[x];
    if (S->win_len[x] == w) { /* popleft */
        S->pred[m] = wm[S->win_head[x]];
        S->win_head[x] = (S->win_head[x] + 1) % w;
        S->win_len[x]--;
    }
    if (gz >= 0) {
        S->gate_z[m] = gz;
        S->gate_side[m] = (int8_t)gs;
    }
    double nb = S->nbytes[m], st = S->stream[m], per_msg = S->per_msg;
    double t_hop = t, end = t + per_msg;
    for (int64_t k = S->path_ptr[m]; k < S->path_ptr[m + 1]; k++) { /* cost.simulate's reservation */
        int64_t e = S->path_links[k];
        if (S->link_free[e] > t_hop) t_hop = S->link_free[e];
        double fixed = S->lat[e] + per_msg, inv = 1.0 / S->cap[e];
        S->link_free[e] = t_hop + (fixed + nb * inv);
        t_hop += S->lat[e];
        if (t_hop + per_msg + st > end) end = t_hop + per_msg + st;
    }
    int64_t p = S->norder++;
    S->pop[m] = p;
    S->order[p] = m;
    for (int64_t k = S->dep_ptr[m]; k < S->dep_ptr[m + 1]; k++) S->maxdep[S->dep_idx[k]] = p;
    if (!S->down[m] && S->first_in[S->rep[m]] < 0) S->first_in[S->rep[m]] = m;
    S->t_start[m] = t;
    S->t_end[m] = end;
    if (comps_insert(&S->comp[S->src[m]], end, m) || comps_insert(&S->comp[S->dst[m]], end, m)) return -1;
    S->last[x] = t;
    S->has_last[x] = 1;
    int64_t slot = (S->win_head[x] + S->win_len[x]) % w;
    wm[slot] = m;
    we[slot] = end;
    S->win_len[x]++;
    S->allow[x] = S->win_len[x] == w ? we[S->win_head[x]] : 0.0;
    Item done = {end, 0, S->seq++, m};
    if (ih_push(&S->ev, done)) return -1;
    if (end > S->makespan) S->makespan = end;
    if (S->queue[x].n) {
        Item again = {t >= S->allow[x] ? t : S->allow[x], 1, S->seq++, x};
        if (ih_push(&S->ev, again)) return -1;
    }
    return 0;
}

static int exact_ready(Exact *S, int64_t m, double t) {
    int64_t x = S->port[m];
    double a = S->allow[x];
    Item q = {S->key[m], !S->down[m], -m, m};
    Item e = {t >= a ? t : a, 1, S->seq++, x};
    return ih_push(&S->queue[x], q) || ih_push(&S->ev, e) ? -1 : 0;
}

/* the loop; 0 done, -1 out of memory, -2 the event bound passed. ports, mark, go: nl each */
static int exact_run(Exact *S, int64_t *ports, int64_t *mark, Go *go) {
    for (Py_ssize_t m = 0; m < S->nm; m++)
        if (S->remaining[m] == 0 && exact_ready(S, m, 0.0)) return -1;
    /* a bound far above any run: each message is made ready, starts and completes once, and a
       port waits only for a later completion of its rank or its message's receiver, so its
       tries grow with the messages times the ports (a rank may own many), not the ranks alone */
    int64_t budget = (int64_t)64 * (S->nm + S->nl + 1) * (S->nranks + S->nl + 16), pops = 0;
    while (S->ev.n > 0) {
        if (++pops > budget) return -2;
        Item top = ih_pop(&S->ev);
        double t = top.k;
        int64_t first = pops;
        if (top.a == 0) {
            for (int64_t k = S->dep_ptr[top.x]; k < S->dep_ptr[top.x + 1]; k++) {
                int64_t d = S->dep_idx[k];
                if (--S->remaining[d] == 0 && exact_ready(S, d, t)) return -1;
            }
            continue;
        }
        /* every port tried at this instant, in increasing order, once each */
        Py_ssize_t np_ = 0;
        mark[top.x] = pops;
        ports[np_++] = top.x;
        while (S->ev.n > 0 && ((Item *)S->ev.a)[0].k == t && ((Item *)S->ev.a)[0].a == 1) {
            if (++pops > budget) return -2;
            int64_t x = ih_pop(&S->ev).x;
            if (mark[x] < first) { /* not yet among this instant's ports */
                mark[x] = pops;
                ports[np_++] = x;
            }
        }
        qsort(ports, (size_t)np_, sizeof(int64_t), i64_cmp);
        Py_ssize_t ngo = 0;
        for (Py_ssize_t i = 0; i < np_; i++) {
            int64_t x = ports[i];
            Heap *q = &S->queue[x];
            if (q->n == 0 || t < S->allow[x]) continue;
            int64_t m = ((Item *)q->a)[0].x, gz;
            int gs;
            double wait;
            if (decide(S, x, m, t, &gz, &gs, &wait)) {
                go[ngo].x = x, go[ngo].m = m, go[ngo].gz = gz, go[ngo].gs = gs;
                ngo++;
            } else {
                Item e = {wait, 1, S->seq++, x};
                if (ih_push(&S->ev, e)) return -1;
            }
        }
        if (ngo == 1) {
            if (exact_start(S, go[0].x, go[0].m, t, go[0].gz, go[0].gs)) return -1;
            continue;
        }
        if (ngo == 0) continue;
        /* in the simulator's order among the messages ready at this instant */
        int any_up = 0;
        for (Py_ssize_t i = 0; i < ngo; i++) {
            sim_key(S, go[i].x, go[i].m, go[i].gz, go[i].gs, go[i].k);
            any_up |= !S->down[go[i].m];
        }
        qsort(go, (size_t)ngo, sizeof(Go), go_cmp);
        if (go[0].k[0] < 0 && any_up) {
            /* an up message's key depends on which Copy the others' starts create: the least
               key now, the first in the sorted order among equal ones */
            for (Py_ssize_t left = ngo; left > 0; left--) {
                Py_ssize_t bi = 0;
                int64_t bk[4], k[4];
                sim_key(S, go[0].x, go[0].m, go[0].gz, go[0].gs, bk);
                for (Py_ssize_t i = 1; i < left; i++) {
                    sim_key(S, go[i].x, go[i].m, go[i].gz, go[i].gs, k);
                    if (key_cmp(k, bk) < 0) {
                        bi = i;
                        memcpy(bk, k, sizeof(k));
                    }
                }
                Go g = go[bi];
                memmove(go + bi, go + bi + 1, (size_t)(left - bi - 1) * sizeof(Go));
                if (exact_start(S, g.x, g.m, t, g.gz, g.gs)) return -1;
            }
        } else {
            for (Py_ssize_t i = 0; i < ngo; i++)
                if (exact_start(S, go[i].x, go[i].m, t, go[i].gz, go[i].gs)) return -1;
        }
    }
    return 0;
}

#define NEXACT 26

/* whether every v[i] (i < n) lies in [lo, hi) */
static int in_range(const int64_t *v, Py_ssize_t n, int64_t lo, int64_t hi) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (v[i] < lo || v[i] >= hi) return 0;
    return 1;
}

static PyObject *exact(PyObject *self, PyObject *args) {
    Py_buffer b[NEXACT];
    Exact S;
    Py_ssize_t nranks;
    memset(b, 0, sizeof(b));
    memset(&S, 0, sizeof(S));
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*y*w*y*y*y*y*y*y*y*y*y*dnw*w*w*w*w*w*w*w*", &b[0], &b[1], &b[2],
                          &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13],
                          &b[14], &b[15], &b[16], &b[17], &S.per_msg, &nranks, &b[18], &b[19], &b[20], &b[21],
                          &b[22], &b[23], &b[24], &b[25]))
        return NULL;
    PyObject *result = NULL;
    int64_t *ports = NULL, *mark = NULL;
    Go *go = NULL;
    Py_ssize_t nm = b[0].len / 8, nl = b[16].len / 8;
    S.nm = nm, S.nl = nl, S.nranks = nranks;
    S.port = b[0].buf, S.path_ptr = b[1].buf, S.path_links = b[2].buf, S.nbytes = b[3].buf, S.key = b[4].buf;
    S.down = b[5].buf, S.dep_ptr = b[6].buf, S.dep_idx = b[7].buf, S.remaining = b[8].buf, S.src = b[9].buf;
    S.dst = b[10].buf, S.rep = b[11].buf, S.upz = b[12].buf, S.avgroot = b[13].buf, S.port_rank = b[14].buf;
    S.wsize = b[15].buf, S.lat = b[16].buf, S.cap = b[17].buf, S.order = b[18].buf, S.pred = b[19].buf;
    S.t_start = b[20].buf, S.t_end = b[21].buf, S.pop = b[22].buf, S.gate_z = b[23].buf, S.gate_side = b[24].buf;
    S.first_in = b[25].buf;

    /* every length and index checked before the loop reads it */
    Py_ssize_t i64[] = {0, 9, 10, 11, 12, 18, 19, 22, 23, 25}, f64[] = {3, 4, 20, 21}, i8[] = {5, 13, 24};
    int ok = nranks > 0 && b[1].len == (nm + 1) * 8 && b[6].len == (nm + 1) * 8 && b[8].len == nm * 8 &&
             b[14].len == nl * 8 && b[15].len == nl * 8 && b[17].len == nl * 8 && b[2].len % 8 == 0 &&
             b[7].len % 8 == 0;
    for (size_t i = 0; ok && i < sizeof(i64) / sizeof(i64[0]); i++) ok = b[i64[i]].len == nm * 8;
    for (size_t i = 0; ok && i < sizeof(f64) / sizeof(f64[0]); i++) ok = b[f64[i]].len == nm * 8;
    for (size_t i = 0; ok && i < sizeof(i8) / sizeof(i8[0]); i++) ok = b[i8[i]].len == nm;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "exact: array lengths disagree");
        goto out;
    }
    Py_ssize_t npl = b[2].len / 8, ndi = b[7].len / 8;
    ok = S.path_ptr[0] == 0 && S.path_ptr[nm] == npl && S.dep_ptr[0] == 0 && S.dep_ptr[nm] == ndi &&
         in_range(S.path_links, npl, 0, nl) && in_range(S.dep_idx, ndi, 0, nm) && in_range(S.src, nm, 0, nranks) &&
         in_range(S.dst, nm, 0, nranks) && in_range(S.upz, nm, -1, nm) && in_range(S.remaining, nm, 0, nm + 1) &&
         in_range(S.port_rank, nl, -1, nranks);
    for (Py_ssize_t m = 0; ok && m < nm; m++) {
        int64_t x = S.port[m];
        ok = S.path_ptr[m] < S.path_ptr[m + 1] && S.path_ptr[m + 1] <= npl && S.dep_ptr[m] <= S.dep_ptr[m + 1] &&
             S.dep_ptr[m + 1] <= ndi && S.path_links[S.path_ptr[m]] == x && S.port_rank[x] == S.src[m] &&
             S.src[m] != S.dst[m] &&
             (S.down[m] ? S.rep[m] == -1 : S.rep[m] >= 0 && S.rep[m] < nm);
        for (int64_t k = S.path_ptr[m]; ok && k < S.path_ptr[m + 1]; k++) ok = S.cap[S.path_links[k]] > 0.0;
    }
    /* every sending link's window, whether or not a message starts on it: all are allocated */
    for (Py_ssize_t x = 0; ok && x < nl; x++)
        ok = S.port_rank[x] < 0 || (S.wsize[x] >= 1 && S.wsize[x] <= (int64_t)1 << 20);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "exact: an index or a size out of range");
        goto out;
    }

    S.queue = calloc((size_t)(nl ? nl : 1), sizeof(Heap));
    S.comp = calloc((size_t)nranks, sizeof(Comps));
    S.link_free = calloc((size_t)(nl ? nl : 1), sizeof(double));
    S.allow = calloc((size_t)(nl ? nl : 1), sizeof(double));
    S.last = calloc((size_t)(nl ? nl : 1), sizeof(double));
    S.has_last = calloc((size_t)(nl ? nl : 1), 1);
    S.stream = malloc((size_t)(nm ? nm : 1) * sizeof(double));
    S.has_deps = malloc((size_t)(nm ? nm : 1));
    S.maxdep = calloc((size_t)(nm ? nm : 1), sizeof(int64_t));
    S.win_off = calloc((size_t)(nl + 1), sizeof(int64_t));
    S.win_head = calloc((size_t)(nl ? nl : 1), sizeof(int64_t));
    S.win_len = calloc((size_t)(nl ? nl : 1), sizeof(int64_t));
    ports = malloc((size_t)(nl ? nl : 1) * sizeof(int64_t));
    mark = calloc((size_t)(nl ? nl : 1), sizeof(int64_t));
    go = malloc((size_t)(nl ? nl : 1) * sizeof(Go));
    if (!S.queue || !S.comp || !S.link_free || !S.allow || !S.last || !S.has_last || !S.stream || !S.has_deps ||
        !S.maxdep || !S.win_off || !S.win_head || !S.win_len || !ports || !mark || !go) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t x = 0; x < nl; x++) S.win_off[x + 1] = S.win_off[x] + (S.port_rank[x] >= 0 ? S.wsize[x] : 0);
    S.win_m = malloc((size_t)(S.win_off[nl] ? S.win_off[nl] : 1) * sizeof(int64_t));
    S.win_e = malloc((size_t)(S.win_off[nl] ? S.win_off[nl] : 1) * sizeof(double));
    if (!S.win_m || !S.win_e) {
        PyErr_NoMemory();
        goto out;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t m = 0; m < nm; m++) {
        double cmin = INFINITY;
        for (int64_t k = S.path_ptr[m]; k < S.path_ptr[m + 1]; k++)
            if (S.cap[S.path_links[k]] < cmin) cmin = S.cap[S.path_links[k]];
        S.stream[m] = S.nbytes[m] / cmin;
        S.has_deps[m] = S.remaining[m] > 0;
        S.pred[m] = S.pop[m] = S.gate_z[m] = S.first_in[m] = -1;
        S.gate_side[m] = 0;
        S.t_start[m] = S.t_end[m] = 0.0;
    }
    rc = exact_run(&S, ports, mark, go);
    Py_END_ALLOW_THREADS
    if (rc == -1) PyErr_NoMemory();
    else if (rc == -2) PyErr_SetString(PyExc_RuntimeError, "exact: the event bound passed (a schedule that never settles)");
    else result = Py_BuildValue("ndn", (Py_ssize_t)S.norder, S.makespan, (Py_ssize_t)S.ungated);
out:
    if (S.queue)
        for (Py_ssize_t x = 0; x < nl; x++) free(S.queue[x].a);
    if (S.comp)
        for (Py_ssize_t r = 0; r < nranks; r++) free(S.comp[r].a);
    void *owned[] = {S.queue, S.comp, S.ev.a, S.link_free, S.allow, S.last, S.has_last, S.stream, S.has_deps,
                     S.maxdep, S.win_off, S.win_head, S.win_len, S.win_m, S.win_e, ports, mark, go};
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) free(owned[i]);
    for (int i = 0; i < NEXACT; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

/* ---------------------------------------------------------------------------------------------
   arborescence(w, root, par) -> found: compiler/treepack_master.py's Chu-Liu/Edmonds
   (_edmonds_cols, the reference) on the n x n float64 matrix ``w`` (w[u*n + v]: the cost of
   u -> v; column ``root`` and the diagonal inf), the same steps and tie-breaks: every vertex
   takes its first cheapest in-arc; the cycles of those arcs, found walking from each vertex
   in turn, contract (the vertices off every cycle numbered first, then the cycles in the
   order found), arcs into a cycle discounted by the cycle arc they replace, arcs inside a
   group dropped; recurse; expand each group's entering arc as the first cheapest between
   the two groups' members (parent-major). Fills par (int64, -1 at the root); 0 where some
   vertex has no finite in-arc. The packings price a tree this way per root and round
   (hundreds per pack at 16 ranks), where the Python reference spent a third of the pack. */
static int arb_rec(const double *c, int64_t n, int64_t root, int64_t *par) {
    /* c: in-arc layout, c[v*n + u] = cost u -> v. Returns 1 found, 0 none, -1 no memory. */
    int rc = -1;
    double *inw = malloc((size_t)n * sizeof(double)), *adj = NULL, *small = NULL;
    int64_t *color = malloc((size_t)n * sizeof(int64_t)), *cyc = malloc((size_t)n * sizeof(int64_t)),
            *group = malloc((size_t)n * sizeof(int64_t)), *mstart = NULL, *mlist = NULL, *sub = NULL;
    if (!inw || !color || !cyc || !group) goto out;
    for (int64_t v = 0; v < n; v++) {
        par[v] = -1;
        inw[v] = 0.0;
        if (v == root) continue;
        const double *col = c + v * n;
        double m = col[0];
        int64_t at = 0;
        for (int64_t u = 1; u < n; u++)
            if (col[u] < m) m = col[u], at = u;
        if (m == INFINITY) {
            rc = 0;
            goto out;
        }
        par[v] = at;
        inw[v] = m;
    }
    int64_t ncyc = 0;
    for (int64_t v = 0; v < n; v++) color[v] = cyc[v] = -1;
    for (int64_t s = 0; s < n; s++) {
        int64_t v = s;
        while (v != -1 && color[v] == -1) {
            color[v] = s;
            v = par[v];
        }
        if (v != -1 && color[v] == s) {
            int64_t u = v;
            do {
                cyc[u] = ncyc;
                u = par[u];
            } while (u != v);
            ncyc++;
        }
    }
    if (ncyc == 0) {
        rc = 1;
        goto out;
    }
    int64_t gid = 0;
    for (int64_t v = 0; v < n; v++)
        if (cyc[v] == -1) group[v] = gid++;
    int64_t singles = gid;
    gid += ncyc;
    for (int64_t v = 0; v < n; v++)
        if (cyc[v] >= 0) group[v] = singles + cyc[v];
    /* members per group, in vertex order (CSR) */
    mstart = calloc((size_t)gid + 1, sizeof(int64_t));
    mlist = malloc((size_t)n * sizeof(int64_t));
    adj = malloc((size_t)n * (size_t)n * sizeof(double));
    small = calloc((size_t)gid * (size_t)gid, sizeof(double));
    sub = malloc((size_t)gid * sizeof(int64_t));
    if (!mstart || !mlist || !adj || !small || !sub) goto out;
    for (int64_t v = 0; v < n; v++) mstart[group[v] + 1]++;
    for (int64_t g = 0; g < gid; g++) mstart[g + 1] += mstart[g];
    {
        int64_t *fill = color; /* reused: the next free slot per group */
        for (int64_t g = 0; g < gid; g++) fill[g] = mstart[g];
        for (int64_t v = 0; v < n; v++) mlist[fill[group[v]]++] = v;
    }
    /* adj: each cycle vertex's in-arcs discounted by its cycle arc, arcs from its own cycle
       dropped; every other column as it is */
    for (int64_t v = 0; v < n; v++) {
        const double *col = c + v * n;
        double *out_col = adj + v * n;
        if (cyc[v] < 0) {
            memcpy(out_col, col, (size_t)n * sizeof(double));
            continue;
        }
        double d = inw[v];
        for (int64_t u = 0; u < n; u++) out_col[u] = col[u] - d;
        int64_t g = group[v];
        for (int64_t k = mstart[g]; k < mstart[g + 1]; k++) out_col[mlist[k]] = INFINITY;
    }
    /* small[b*gid + a]: the cheapest arc from group a into group b */
    for (int64_t b = 0; b < gid; b++) {
        double *row = small + b * gid;
        for (int64_t a = 0; a < gid; a++) {
            double m = INFINITY;
            for (int64_t kb = mstart[b]; kb < mstart[b + 1]; kb++) {
                const double *col = adj + mlist[kb] * n;
                for (int64_t ka = mstart[a]; ka < mstart[a + 1]; ka++)
                    if (col[mlist[ka]] < m) m = col[mlist[ka]];
            }
            row[a] = m;
        }
    }
    int got = arb_rec(small, gid, group[root], sub);
    if (got != 1) {
        rc = got;
        goto out;
    }
    for (int64_t b = 0; b < gid; b++) {
        int64_t a = sub[b];
        if (a == -1) continue;
        double best = INFINITY;
        int64_t bu = mlist[mstart[a]], bv = mlist[mstart[b]];
        for (int64_t ka = mstart[a]; ka < mstart[a + 1]; ka++)
            for (int64_t kb = mstart[b]; kb < mstart[b + 1]; kb++) {
                int64_t u = mlist[ka], v = mlist[kb];
                if (adj[v * n + u] < best) best = adj[v * n + u], bu = u, bv = v;
            }
        par[bv] = bu;
    }
    par[root] = -1;
    rc = 1;
out:
    free(inw);
    free(adj);
    free(small);
    free(color);
    free(cyc);
    free(group);
    free(mstart);
    free(mlist);
    free(sub);
    return rc;
}

static PyObject *arborescence(PyObject *self, PyObject *args) {
    Py_buffer bw = {0}, bp = {0};
    Py_ssize_t root;
    if (!PyArg_ParseTuple(args, "y*nw*", &bw, &root, &bp)) return NULL;
    PyObject *result = NULL;
    int64_t n = (int64_t)(bp.len / (Py_ssize_t)sizeof(int64_t));
    if (bw.len != (Py_ssize_t)(n * n * (int64_t)sizeof(double)) || root < 0 || root >= n) {
        PyErr_SetString(PyExc_ValueError, "arborescence: w must be n x n float64 and root one of its vertices");
        goto done;
    }
    double *c = malloc((size_t)(n ? n * n : 1) * sizeof(double));
    if (!c) {
        PyErr_NoMemory();
        goto done;
    }
    const double *w = bw.buf;
    for (int64_t u = 0; u < n; u++)
        for (int64_t v = 0; v < n; v++) c[v * n + u] = w[u * n + v];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = arb_rec(c, n, (int64_t)root, bp.buf);
    Py_END_ALLOW_THREADS
    free(c);
    if (rc < 0) PyErr_NoMemory();
    else result = PyBool_FromLong(rc);
done:
    PyBuffer_Release(&bw);
    PyBuffer_Release(&bp);
    return result;
}

static PyMethodDef methods[] = {
    {"simulate", simulate, METH_VARARGS, "the simulator's event loop over flat arrays (compiler/cost.py)"},
    {"wfq", wfq, METH_VARARGS, "the timed lowering's list schedule over flat arrays (compiler/schedule.py)"},
    {"exact", exact, METH_VARARGS, "the exact (switch) list schedule over flat arrays (compiler/schedule.py)"},
    {"arborescence", arborescence, METH_VARARGS, "Chu-Liu/Edmonds on a dense matrix (compiler/treepack_master.py)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.compiler._simcore",
                                       "the simulator's event loop (compiler/cost.py)", -1, methods};

PyMODINIT_FUNC PyInit__simcore(void) { return PyModule_Create(&moduledef); }
