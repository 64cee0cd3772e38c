/* hcc.ir._verifycore — checks 4-7 of ir/verify.py (races, deadlock order, symbolic execution,
   final buffers) over a plan's op columns, for the plans that need nothing more general.

   run(n, words, code, rank, dep_ptr, dep_idx, rslot, rend, roff, wslot, wend, woff, extra, partner,
       succ_ptr, succ_idx, indeg, nslots, out_rng, slot_start, slot_end,
       req_ptr, req_lo, req_hi, req_shift, req_bit, req_div) -> (0, "") or (1, why)

   The caller (ir/verify_native.py) prepares every column and decides nothing here changes:
   0 means every check passed; 1 means a check failed *or* the plan needs what this core does
   not represent (a value of two shifts, a slot of two values); the caller then runs ir/verify.py's Python checks,
   which accept or name the fault exactly. This core never accepts what they reject:

   - ops are global ids g (rank-major, as ir/opscan.py numbers them); code 0 Send, 1 Recv,
     2 RecvReduce, 3 Copy, 4 Reduce, 5 Scale. dep_ptr/dep_idx: g's deps as global ids, in
     op order. rslot[g]..rend[g]: the slots g reads (rslot -1 none, -2 the read-only ``in``),
     roff[g] the first element it reads; wslot[g]..wend[g], woff[g]: the same for what it
     writes; extra[g]: a Scale's divisor; partner[g]: a Send's matching receive.
   - slot: one elementary (rank, buffer, range) of ``out``/``tmp`` (slot_start, slot_end):
     the caller cuts each buffer at every end of a range its ops name, so an op's range is a
     run of whole slots and a slot is the unit of both the race state and the value.
     out_rng[2r]..out_rng[2r+1]: rank r's ``out`` slots, by start.
   - races (check 4): per slot the last plain writer, the reductions and the readers since,
     each later access checked, once for all its slots, to be a descendant along deps (the
     same backward search as verify._unordered, limited to ids >= the smallest target).
   - order (check 5): Kahn's algorithm over the completes-before CSR succ_ptr/succ_idx with
     in-degrees indeg (consumed), ready ops taken last-in first-out as verify._order does.
   - values (check 6): one term group per slot, (shift, rank mask of ``words`` 64-bit
     words, divisor), as ir/verify_values.py's value ((shift, mask),), divisor; a message
     carries the run of its source slots' values (equal neighbours merged), and each slot it
     lands on must lie inside one of them.
   - final (check 7): rank r's ``out`` runs req_ptr[r]..req_ptr[r+1] must be covered by
     written slots equal to (req_shift, bit req_bit or every rank when -1, req_div). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t *a;
    Py_ssize_t n, cap;
} Vec;

static int vec_push(Vec *v, int64_t x) {
    if (v->n == v->cap) {
        Py_ssize_t nc = v->cap ? v->cap * 2 : 1024;
        int64_t *na = realloc(v->a, (size_t)nc * sizeof(int64_t));
        if (!na) return -1;
        v->a = na;
        v->cap = nc;
    }
    v->a[v->n++] = x;
    return 0;
}

typedef struct {
    const int64_t *dep_ptr, *dep_idx;
    uint32_t *seen, *want;
    uint32_t stamp;
    Vec stack;
} Anc;

/* 1 when every target is op i itself or an ancestor of i along deps, 0 when not, -1 out of memory */
static int ordered(Anc *A, int64_t i, const int64_t *tgt, Py_ssize_t nt) {
    if (nt == 0) return 1;
    uint32_t s = ++A->stamp;
    Py_ssize_t left = 0;
    int64_t low = INT64_MAX;
    for (Py_ssize_t k = 0; k < nt; k++) {
        int64_t t = tgt[k];
        if (t == i || A->want[t] == s) continue;
        A->want[t] = s;
        left++;
    }
    for (int64_t k = A->dep_ptr[i]; k < A->dep_ptr[i + 1]; k++) {
        int64_t d = A->dep_idx[k];
        if (A->want[d] == s) {
            A->want[d] = 0;
            left--;
        }
    }
    if (left == 0) return 1;
    for (Py_ssize_t k = 0; k < nt; k++)
        if (A->want[tgt[k]] == s && tgt[k] < low) low = tgt[k];
    A->stack.n = 0;
    if (vec_push(&A->stack, i)) return -1;
    A->seen[i] = s;
    while (A->stack.n && left) {
        int64_t x = A->stack.a[--A->stack.n];
        for (int64_t k = A->dep_ptr[x]; k < A->dep_ptr[x + 1]; k++) {
            int64_t d = A->dep_idx[k];
            if (d < low || A->seen[d] == s) continue;
            A->seen[d] = s;
            if (A->want[d] == s) {
                A->want[d] = 0;
                left--;
            }
            if (vec_push(&A->stack, d)) return -1;
        }
    }
    return left == 0;
}

#define NBUF 25

/* a value of the message being moved: pieces of (relative start, shift, divisor, W mask words) */
#define PIECE(v, k) ((v)->a + (k) * (W + 3))

/* append piece [rel, ...) with value (shift, div, mask) to cur, merged into the last piece when
   the values are equal (a run of one value, as verify_values keeps it) */
static int piece_push(Vec *cur, Py_ssize_t W, int64_t rel, int64_t shift, int64_t div, const uint64_t *mask) {
    Py_ssize_t np_ = cur->n / (W + 3);
    if (np_) {
        int64_t *last = cur->a + (np_ - 1) * (W + 3);
        if (last[1] == shift && last[2] == div && !memcmp(last + 3, mask, (size_t)W * 8)) return 0;
    }
    if (vec_push(cur, rel) || vec_push(cur, shift) || vec_push(cur, div)) return -1;
    for (Py_ssize_t j = 0; j < W; j++)
        if (vec_push(cur, (int64_t)mask[j])) return -1;
    return 0;
}

static PyObject *run(PyObject *self, PyObject *args) {
    Py_buffer b[NBUF];
    Py_ssize_t n, W, nslots;
    memset(b, 0, sizeof(b));
    if (!PyArg_ParseTuple(args, "nny*y*y*y*y*y*y*y*y*y*y*y*y*y*w*ny*y*y*y*y*y*y*y*y*", &n, &W, &b[0], &b[1], &b[2],
                          &b[3], &b[4], &b[5], &b[6], &b[7], &b[8], &b[9], &b[10], &b[11], &b[12], &b[13], &b[14],
                          &nslots, &b[15], &b[16], &b[17], &b[18], &b[19], &b[20], &b[21], &b[22], &b[23]))
        return NULL;
    const int8_t *code = b[0].buf;
    const int64_t *rank = b[1].buf, *dep_ptr = b[2].buf, *dep_idx = b[3].buf, *rslot = b[4].buf, *rend = b[5].buf,
                  *roff = b[6].buf, *wslot = b[7].buf, *wend = b[8].buf, *woff = b[9].buf, *extra = b[10].buf,
                  *partner = b[11].buf, *succ_ptr = b[12].buf, *succ_idx = b[13].buf, *out_rng = b[15].buf,
                  *slot_start = b[16].buf, *slot_end = b[17].buf, *req_ptr = b[18].buf, *req_lo = b[19].buf,
                  *req_hi = b[20].buf, *req_shift = b[21].buf, *req_bit = b[22].buf, *req_div = b[23].buf;
    int64_t *indeg = b[14].buf;
    Py_ssize_t total = b[0].len;
    const char *why = NULL;
    int oom = 0;

    /* every allocation of the checks, freed together at the end */
    Anc A = {dep_ptr, dep_idx, calloc((size_t)total + 1, 4), calloc((size_t)total + 1, 4), 0, {0}};
    int64_t *w = malloc((size_t)(nslots + 1) * 8), *red = malloc((size_t)(nslots + 1) * 8),
            *rd = malloc((size_t)(nslots + 1) * 8);
    Vec node_op = {0}, node_next = {0}, tg = {0}, order = {0}, ready = {0}, pool = {0}, free_list = {0}, cur = {0};
    int64_t *inflight = malloc((size_t)(total + 1) * 8);
    int8_t *written = calloc((size_t)nslots + 1, 1);
    int64_t *vshift = malloc((size_t)(nslots + 1) * 8), *vdiv = malloc((size_t)(nslots + 1) * 8);
    uint64_t *vmask = calloc((size_t)(nslots + 1) * (size_t)W, 8);
    uint64_t *tmp = calloc((size_t)W + 1, 8);
    if (!A.seen || !A.want || !w || !red || !rd || !inflight || !written || !vshift || !vdiv || !vmask || !tmp) {
        oom = 1;
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    /* -- 4. races: per slot, last plain writer w, reductions red and readers rd (lists); an op
       over several slots is checked once against the targets of all of them -- */
    for (Py_ssize_t s = 0; s < nslots; s++) w[s] = red[s] = rd[s] = -1;
#define COLLECT(head)                                                              \
    for (int64_t q = (head); q >= 0; q = node_next.a[q])                          \
        if (vec_push(&tg, node_op.a[q])) { oom = 1; break; }
#define PREPEND(head, g)                                                           \
    if (vec_push(&node_op, (g)) || vec_push(&node_next, (head))) { oom = 1; break; } \
    (head) = node_op.n - 1;
    for (Py_ssize_t g = 0; g < total && !why && !oom; g++) {
        int c = code[g];
        if (rslot[g] >= 0) { /* a read: ordered after the writers and the reductions */
            tg.n = 0;
            for (int64_t s = rslot[g]; s < rend[g] && !oom; s++) {
                if (w[s] >= 0 && vec_push(&tg, w[s])) { oom = 1; break; }
                COLLECT(red[s]);
            }
            if (oom) break;
            int ok = ordered(&A, g, tg.a, tg.n);
            if (ok < 0) { oom = 1; break; }
            if (!ok) { why = "data race (read)"; break; }
            for (int64_t s = rslot[g]; s < rend[g]; s++) {
                PREPEND(rd[s], g);
            }
            if (oom) break;
        }
        if (wslot[g] >= 0) {
            int commuting = c == 2 || c == 4;
            tg.n = 0;
            for (int64_t s = wslot[g]; s < wend[g] && !oom; s++) {
                if (w[s] >= 0 && vec_push(&tg, w[s])) { oom = 1; break; }
                COLLECT(rd[s]);
                if (!commuting) COLLECT(red[s]);
            }
            if (oom) break;
            int ok = ordered(&A, g, tg.a, tg.n);
            if (ok < 0) { oom = 1; break; }
            if (!ok) { why = "data race (write)"; break; }
            for (int64_t s = wslot[g]; s < wend[g]; s++) {
                if (commuting) {
                    PREPEND(red[s], g);
                } else {
                    w[s] = g;
                    red[s] = rd[s] = -1;
                }
            }
            if (oom) break;
        }
    }
    /* -- 5. a topological order of the completes-before graph (verify._order's) -- */
    for (Py_ssize_t x = 0; x < total && !why && !oom; x++)
        if (indeg[x] == 0 && vec_push(&ready, x)) oom = 1;
    while (ready.n && !why && !oom) {
        int64_t x = ready.a[--ready.n];
        if (vec_push(&order, x)) { oom = 1; break; }
        for (int64_t k = succ_ptr[x]; k < succ_ptr[x + 1]; k++) {
            int64_t y = succ_idx[k];
            if (--indeg[y] == 0 && vec_push(&ready, y)) { oom = 1; break; }
        }
    }
    if (!why && !oom && order.n != total) why = "dependency cycle";
    /* -- 6. symbolic execution in that order; the value an op moves is `cur`: its pieces
       relative to the op's first element, message shifts (element p of the range holds the
       term at input position p + shift) -- */
    for (Py_ssize_t k = 0; k < order.n && !why && !oom; k++) {
        int64_t g = order.a[k];
        int c = code[g];
        cur.n = 0;
        if (c == 0 || c == 3 || c == 4) { /* the source value */
            int64_t s = rslot[g];
            if (s == -2) {
                memset(tmp, 0, (size_t)W * 8);
                tmp[rank[g] >> 6] = 1ull << (rank[g] & 63);
                if (piece_push(&cur, W, 0, roff[g], 1, tmp)) { oom = 1; break; }
            } else {
                for (; s < rend[g]; s++) {
                    if (!written[s]) { why = "reads elements never written"; break; }
                    if (piece_push(&cur, W, slot_start[s] - roff[g], vshift[s] + roff[g], vdiv[s], vmask + s * W)) {
                        oom = 1;
                        break;
                    }
                }
                if (why || oom) break;
            }
            if (c == 0) { /* in flight until its receive: [pieces, piece...] in the pool */
                int64_t e, np_ = cur.n / (W + 3);
                if (np_ == 1 && free_list.n) {
                    e = free_list.a[--free_list.n];
                } else {
                    e = pool.n;
                    for (Py_ssize_t j = 0; j < cur.n + 1; j++)
                        if (vec_push(&pool, 0)) { oom = 1; break; }
                    if (oom) break;
                }
                pool.a[e] = np_;
                memcpy(pool.a + e + 1, cur.a, (size_t)cur.n * 8);
                inflight[partner[g]] = e;
                continue;
            }
        } else if (c == 1 || c == 2) {
            int64_t e = inflight[g], np_ = pool.a[e];
            for (int64_t j = 0; j < np_ * (W + 3); j++)
                if (vec_push(&cur, pool.a[e + 1 + j])) { oom = 1; break; }
            if (oom) break;
            if (np_ == 1 && vec_push(&free_list, e)) { oom = 1; break; } /* longer entries are not reused */
        } else { /* Scale */
            for (int64_t s = wslot[g]; s < wend[g]; s++) {
                if (!written[s]) { why = "scales elements never written"; break; }
                if (vdiv[s] != 1) { why = "scales twice"; break; }
                vdiv[s] = extra[g];
            }
            continue;
        }
        /* write the pieces over the destination's slots: each slot inside one piece */
        Py_ssize_t np_ = cur.n / (W + 3), p = 0;
        for (int64_t s = wslot[g]; s < wend[g]; s++) {
            int64_t lo = slot_start[s] - woff[g], hi = slot_end[s] - woff[g];
            while (p + 1 < np_ && PIECE(&cur, p + 1)[0] <= lo) p++;
            if (p + 1 < np_ && PIECE(&cur, p + 1)[0] < hi) { why = "a slot holds two values (not represented here)"; break; }
            const int64_t *pc = PIECE(&cur, p);
            int64_t shift = pc[1] - woff[g], div = pc[2];
            const uint64_t *mask = (const uint64_t *)(pc + 3);
            uint64_t *dst = vmask + s * W;
            if (c == 2 || c == 4) { /* a reduction: disjoint terms at the same shift, unscaled */
                if (!written[s]) { why = "combines elements never written"; break; }
                if (vdiv[s] != 1 || div != 1) { why = "reduces a scaled value"; break; }
                if (vshift[s] != shift) { why = "terms at two shifts (not represented here)"; break; }
                for (Py_ssize_t j = 0; j < W; j++) {
                    if (dst[j] & mask[j]) { why = "counts an input twice"; break; }
                    dst[j] |= mask[j];
                }
                if (why) break;
            } else {
                memcpy(dst, mask, (size_t)W * 8);
                vshift[s] = shift;
                vdiv[s] = div;
                written[s] = 1;
            }
        }
    }
    /* -- 7. every rank's out against the required runs -- */
    for (Py_ssize_t r = 0; r < n && !why && !oom; r++) {
        int64_t k = out_rng[2 * r], kend = out_rng[2 * r + 1];
        for (int64_t q = req_ptr[r]; q < req_ptr[r + 1] && !why; q++) {
            int64_t lo = req_lo[q], hi = req_hi[q], pos = lo;
            if (hi <= lo) continue;
            while (k < kend && slot_end[k] <= lo) k++;
            int64_t j = k;
            for (; j < kend && slot_start[j] < hi; j++) {
                if (slot_start[j] > pos || !written[j]) { why = "out not fully written"; break; }
                if (vshift[j] != req_shift[q] || vdiv[j] != req_div[q]) { why = "wrong out value"; break; }
                const uint64_t *m = vmask + j * W;
                for (Py_ssize_t x = 0; x < W; x++) {
                    uint64_t want;
                    if (req_bit[q] >= 0) {
                        want = (req_bit[q] >> 6) == x ? 1ull << (req_bit[q] & 63) : 0;
                    } else {
                        Py_ssize_t bits = n - 64 * x;
                        want = bits >= 64 ? ~0ull : (1ull << bits) - 1;
                    }
                    if (m[x] != want) { why = "wrong out value"; break; }
                }
                if (why) break;
                pos = slot_end[j];
            }
            if (!why && pos < hi) why = "out not fully written";
        }
    }
    Py_END_ALLOW_THREADS
done:;
    void *owned[] = {A.seen, A.want, A.stack.a, w, red, rd, node_op.a, node_next.a, tg.a, order.a, ready.a,
                     pool.a, free_list.a, cur.a, inflight, written, vshift, vdiv, vmask, tmp};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
    for (int i = 0; i < NBUF; i++) {
        if (b[i].obj) PyBuffer_Release(&b[i]);
    }
    if (oom) return PyErr_NoMemory();
    return Py_BuildValue("(is)", why ? 1 : 0, why ? why : "");
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "checks 4-7 of ir/verify.py over a plan's op columns"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.ir._verifycore",
                                       "the verifier's checks 4-7 over op columns (ir/verify_native.py)", -1,
                                       methods};

PyMODINIT_FUNC PyInit__verifycore(void) { return PyModule_Create(&moduledef); }
