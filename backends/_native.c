/* hcc.backends._native — the native core of hcc's runtime: reduction kernels, the
 * shared-memory channel engine, and the loop that runs one rank's compiled program.
 *
 * Terms (see backends/native.py and backends/shm.py for the Python side)
 * - segment: one memfd per rank, mapped MAP_SHARED by every local peer. It holds the rank's
 *   bell (64 bytes) and one ring per local peer it sends to. A peer maps the segment from an
 *   fd passed over an authenticated unix socket; nothing has a name in any filesystem, so a
 *   segment dies with the last process that maps it, SIGKILL included.
 * - ring: a single-producer single-consumer byte queue of nslots * (64 + slot_bytes) bytes.
 *   `head` (bytes published) is written only by the sender, `tail` (bytes consumed) only by
 *   the receiver; a piece is a 64-byte header (tag, plan id, message length, offset, length)
 *   and at most slot_bytes of the message, padded to 64 bytes; a piece never wraps (a
 *   padding header fills the ring's end), and small messages share the ring's bytes, so a
 *   sender of 4 KiB messages keeps hundreds in flight, not nslots. A message is sent as consecutive pieces; messages from one
 *   sender arrive in the order it sent them and are matched to receives by tag.
 * - bell: a sequence number every producer or consumer bumps after it published or freed
 *   slots of this rank's rings, a `sleeping` flag, and `closed` (set by a clean close). A
 *   rank with nothing to do spins a bounded number of times on the sequence number, then
 *   sets `sleeping`, re-checks, and blocks in poll() on its eventfd and on the unix sockets
 *   of its peers: a waker writes the eventfd only when `sleeping` is set (no syscall while
 *   both sides run), and a peer's death makes its socket readable (EOF) at once, so no
 *   timed polling is needed to notice it.
 * - receive straight from the slot: a piece is copied (Recv) or reduced (RecvReduce, from
 *   the fused Copy's source when there is one) from the slot into its destination; only a
 *   message that arrives before its receive is posted is held in a private buffer.
 * Everything read from a peer's segment is copied out of the slot header before it is
 * checked: lengths and offsets are bounded before any byte moves (a protocol error, never
 * an overrun).
 *
 * One translation unit (~1,800 lines) on purpose: the runner calls the kernels and the ring
 * engine through static inline functions the compiler inlines into its per-piece loop, and
 * they share one module state; its sections: dtypes and ops (the kernels), shared layout,
 * requests (rings and the runner's transfers), the Engine type, module functions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "_native_prog.h" /* the op table, its checks and local ops (shared with _native_tcp.c) */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() do { } while (0)
#endif

/* ------------------------------------------------------------------ dtypes and ops */
enum { DT_F16, DT_BF16, DT_F32, DT_F64, DT_I8, DT_I32, DT_I64, DT_U8, DT_COUNT };
enum { OP_SUM, OP_PROD, OP_MIN, OP_MAX, OP_COUNT };
static const int DT_SIZE[DT_COUNT] = {2, 2, 4, 8, 1, 4, 8, 1};

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest, ties to even; NaN keeps a quiet NaN (backends/kernels.py from_float32) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (f != f)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* NaN-propagating min/max, as numpy.minimum / numpy.maximum */
#define FMIN(a, b) ((a) != (a) ? (a) : ((b) != (b) ? (b) : ((a) < (b) ? (a) : (b))))
#define FMAX(a, b) ((a) != (a) ? (a) : ((b) != (b) ? (b) : ((a) > (b) ? (a) : (b))))
#define IMIN(a, b) ((a) < (b) ? (a) : (b))
#define IMAX(a, b) ((a) > (b) ? (a) : (b))

/* The kernels are compiled twice (AVX2+F16C and baseline x86-64) and picked at load time:
 * float16 converts in hardware with F16C, otherwise through libgcc one element at a time. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KERNEL __attribute__((target_clones("arch=haswell", "default")))
#else
#define KERNEL
#endif

/* dst[i] = EXPR over x = LOAD(a[i]), y = LOAD(b[i]) of compute type V, stored as STORE(...)
 * into storage type T (LOAD/STORE empty: no conversion) */
#define LOOP_AS(T, V, LOAD, STORE, EXPR)                                        \
    do {                                                                         \
        T *restrict d_ = (T *)dst;                                               \
        const T *a_ = (const T *)a;                                              \
        const T *b_ = (const T *)b;                                              \
        for (size_t i = 0; i < n; i++) {                                         \
            V x = LOAD(a_[i]), y = LOAD(b_[i]);                                  \
            d_[i] = STORE(EXPR);                                                 \
        }                                                                        \
    } while (0)
#define LOOP(T, EXPR) LOOP_AS(T, T, , , EXPR)

/* one loop per op, LOOPER(T, expression of x and y) each: the dtypes differ only in how they
 * compute the four ops */
#define OP_CASES(LOOPER, T, SUM, PROD, MINE, MAXE)                                          \
    switch (op) {                                                                              \
    case OP_SUM: LOOPER(T, SUM); break;                                                        \
    case OP_PROD: LOOPER(T, PROD); break;                                                      \
    case OP_MIN: LOOPER(T, MINE); break;                                                       \
    default: LOOPER(T, MAXE); break;                                                           \
    }

/* integer sum and product wrap modulo 2**bits (numpy's in-place ufuncs): computed unsigned */
#define INT_CASES(T, U) OP_CASES(LOOP, T, (T)((U)x + (U)y), (T)((U)x * (U)y), IMIN(x, y), IMAX(x, y))
#define FLOAT_CASES(T) OP_CASES(LOOP, T, x + y, x * y, FMIN(x, y), FMAX(x, y))
/* float16 as numpy computes it: widen both to float32, operate, round once to float16 */
#define HALF_CASES()                                                                          \
    OP_CASES(LOOP, _Float16, (_Float16)((float)x + (float)y), (_Float16)((float)x * (float)y), FMIN(x, y), \
             FMAX(x, y))

#define BF16_LOOP(T, EXPR) LOOP_AS(T, float, bf16_to_f32, f32_to_bf16, EXPR)

/* dst[i] = a[i] (op) b[i], n elements; dst may be a (in place) */
KERNEL static void combine(int op, int dt, void *dst, const void *a, const void *b, size_t n) {
    switch (dt) {
    case DT_F16: HALF_CASES(); break;
    case DT_BF16: OP_CASES(BF16_LOOP, uint16_t, x + y, x * y, FMIN(x, y), FMAX(x, y)); break;
    case DT_F32: FLOAT_CASES(float); break;
    case DT_F64: FLOAT_CASES(double); break;
    case DT_I8: INT_CASES(int8_t, uint8_t); break;
    case DT_I32: INT_CASES(int32_t, uint32_t); break;
    case DT_I64: INT_CASES(int64_t, uint64_t); break;
    default: INT_CASES(uint8_t, uint8_t); break;
    }
}

#define FLOORDIV(T)                                                             \
    do {                                                                         \
        T *d_ = (T *)dst;                                                        \
        T q_d = (T)divisor;                                                      \
        for (size_t i = 0; i < n; i++) {                                         \
            T x = d_[i], q = x / q_d;                                            \
            if ((x % q_d) != 0 && ((x < 0) != (q_d < 0))) q -= 1;                \
            d_[i] = q;                                                           \
        }                                                                        \
    } while (0)

/* dst /= divisor in place: floor division for integers (numpy //), else the dtype's division
 * (float16 and bfloat16 in float32, rounded once) */
KERNEL static void scale(int dt, void *dst, size_t n, int64_t divisor) {
    switch (dt) {
    case DT_F16: {
        _Float16 *d_ = (_Float16 *)dst;
        float q = (float)(_Float16)divisor;
        for (size_t i = 0; i < n; i++) d_[i] = (_Float16)((float)d_[i] / q);
        break;
    }
    case DT_BF16: {
        uint16_t *d_ = (uint16_t *)dst;
        float q = (float)divisor;
        for (size_t i = 0; i < n; i++) d_[i] = f32_to_bf16(bf16_to_f32(d_[i]) / q);
        break;
    }
    case DT_F32: {
        float *d_ = (float *)dst;
        float q = (float)divisor;
        for (size_t i = 0; i < n; i++) d_[i] = d_[i] / q;
        break;
    }
    case DT_F64: {
        double *d_ = (double *)dst;
        double q = (double)divisor;
        for (size_t i = 0; i < n; i++) d_[i] = d_[i] / q;
        break;
    }
    case DT_I8: FLOORDIV(int8_t); break;
    case DT_I32: FLOORDIV(int32_t); break;
    case DT_I64: FLOORDIV(int64_t); break;
    default: {
        uint8_t *d_ = (uint8_t *)dst;
        uint8_t q = (uint8_t)divisor;
        for (size_t i = 0; i < n; i++) d_[i] = d_[i] / q;
        break;
    }
    }
}

/* ------------------------------------------------------------------ shared layout */
#define SEG_MAGIC 0x4843435348314D31ull /* "HCCSH1M1" */
#define BELL_BYTES 4096                 /* the bell page; rings follow it */

typedef struct {
    uint64_t magic;
    _Atomic uint32_t seq;      /* bumped by every waker */
    _Atomic uint32_t sleeping; /* the owner is (about to be) blocked in poll */
    _Atomic uint32_t closed;   /* the owner closed cleanly */
    _Atomic uint32_t failed_rank; /* 1 + the first rank the owner knows died (0: none) */
    uint32_t pad[10];
} bell_t;

typedef struct {
    _Atomic uint64_t head; /* pieces published (the sender writes it) */
    char pad1[56];
    _Atomic uint64_t tail; /* pieces consumed (the receiver writes it) */
    char pad2[56];
} ring_t;

typedef struct {
    uint32_t tag, plan;
    uint64_t msg_len, offset;
    uint32_t len, pad;
    uint64_t pad2[4];
} slot_hdr_t; /* 64 bytes: the piece's bytes start cache-line aligned */

/* the board: BOARD_SLOTS counters in the bell page of the lowest-numbered rank of the host,
 * which every local rank maps. When the whole job is on one host the adaptive runtime's
 * fast path agrees on them instead of on the rendezvous store (backends/adaptive/fast.py):
 * an atomic add is ~50 ns where a store round trip is a Python server's turn, 0.3-4 ms on
 * this 2-core machine under load. */
#define BOARD_OFF 512
#define BOARD_SLOTS 64

#define SLOT_HDR 64
#define PIECE_SKIP 0x534B4950u /* a header whose `pad` says: padding to the ring's end */
static inline size_t ring_stride(uint32_t nslots, uint32_t slot_bytes) {
    size_t s = sizeof(ring_t) + (size_t)nslots * (SLOT_HDR + (size_t)slot_bytes);
    return (s + 4095) & ~(size_t)4095;
}

/* a ring holds pieces of any length back to back (64-byte aligned), so small messages do not
 * each take a whole slot: nslots * (64 + slot_bytes) bytes of pieces of at most slot_bytes */
#define ring_cap(e) ((uint64_t)(e)->nslots * (SLOT_HDR + (uint64_t)(e)->slot_bytes))
static inline uint64_t piece_span(uint64_t len) { return SLOT_HDR + ((len + 63) & ~(uint64_t)63); }

/* ------------------------------------------------------------------ requests */
enum { R_SEND, R_RECV, R_RECV_REDUCE };

typedef struct held held_t;

typedef struct req {
    int kind, peer; /* peer: local index */
    uint32_t tag, plan;
    char *buf;        /* send: source; receive: destination */
    const char *fsrc; /* RecvReduce with a fused Copy: dst = fsrc (op) piece */
    char *owned;      /* a send's remaining bytes copied here when its run was abandoned */
    size_t nbytes, moved;
    int op, dt;
    int done, discard;
    int64_t id; /* program op index, or the Python-side handle */
    struct req *next;
} req_t;

struct held {
    uint32_t tag, plan;
    size_t len, got;
    char *data;
    int complete;
    req_t *waiter;
    held_t *next;
};

typedef struct {
    int rank;
    ring_t *out, *in;
    char *out_slots, *in_slots;
    bell_t *bell;
    int evfd, sock;
    int dead; /* 0 alive, 1 died, 2 closed cleanly */
    int broken; /* a protocol error from this peer */
    uint64_t out_head, in_tail;
    req_t *sq_head, *sq_tail;         /* sends, in order */
    req_t *posted;                    /* receives posted, in order */
    req_t *cur;                       /* the receive the current message lands in */
    held_t *cur_held;                 /* or the held buffer it lands in */
    uint32_t cur_tag, cur_plan;
    uint64_t cur_len, cur_off;
    int cur_active;
    held_t *held;
    int64_t outstanding;
} peer_t;

typedef struct {
    PyObject_HEAD
    int rank, npeers;
    uint32_t nslots, slot_bytes;
    int spin;
    size_t max_held;
    char *seg;
    size_t seg_size;
    bell_t *bell;
    int evfd;
    peer_t *peers;
    char **peer_segs;
    size_t *peer_seg_sizes;
    pthread_mutex_t mu;
    _Atomic int interrupt;
    int closed;
    char err[256];
    /* Python-API requests: handle -> req */
    req_t **table;
    int64_t table_len;
    /* runner completions */
    int64_t *rdone;
    int64_t rdone_len, rdone_cap;
    int in_runner;
    uint64_t messages; /* data messages sent and received, for tests and benchmarks */
    uint64_t runs;     /* programs run by the runner to completion */
    uint64_t naps;     /* sleeps in poll() after the bounded spin (for benchmarks) */
    uint64_t nap_ns;   /* time spent in them */
    int users;         /* threads inside wait/run with the GIL released (changed under the GIL) */
    int released;      /* the mappings and fds are gone (close, once no thread uses them) */
    /* external transfers (a mixed job: peers over TCP, driven by Python): completions pushed
     * by any thread (ext_done) for the run of generation run_gen, taken by the runner */
    pthread_mutex_t xmu;
    int64_t *xdone;
    int64_t xdone_len, xdone_cap;
    uint64_t run_gen;
    void *cur_run; /* the runner_t of the run in progress (under mu), for fold() */
    _Atomic uint64_t *board; /* BOARD_SLOTS counters (see BOARD_OFF) */
} Engine;

static double now_s(void) { return prog_now_s(); }

/* bump a bell's sequence; write its owner's eventfd only when the owner sleeps */
static void wake_bell(bell_t *bell, int evfd) {
    atomic_fetch_add(&bell->seq, 1);
    if (atomic_load(&bell->sleeping)) {
        uint64_t one = 1;
        ssize_t w = write(evfd, &one, sizeof one);
        (void)w;
    }
}

static void ring_bell(peer_t *p) { wake_bell(p->bell, p->evfd); }

static int push_i64(int64_t **arr, int64_t *len, int64_t *cap, int64_t v) {
    if (*len == *cap) {
        int64_t nc = *cap ? *cap * 2 : 64;
        int64_t *na = realloc(*arr, nc * sizeof(int64_t));
        if (!na) return -1;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*len)++] = v;
    return 0;
}

static void complete_req(Engine *e, req_t *r) {
    r->done = 1;
    e->peers[r->peer].outstanding--;
    e->messages++;
    if (r->owned) {
        free(r->owned);
        r->owned = NULL;
        free(r); /* an abandoned send: nobody waits for it */
        return;
    }
    if (r->discard) {
        free(r);
        return;
    }
    /* a Python-API request (handle bit 62) is only marked done: wait() looks at it */
    if (e->in_runner && r->id >= 0 && !(r->id & ((int64_t)1 << 62)))
        push_i64(&e->rdone, &e->rdone_len, &e->rdone_cap, r->id);
}

/* a piece of `len` bytes at `off` of the receive `r` */
static void land(req_t *r, size_t off, const char *src, size_t len) {
    if (r->discard || len == 0) return;
    if (r->kind == R_RECV) {
        memcpy(r->buf + off, src, len);
    } else {
        size_t es = DT_SIZE[r->dt];
        combine(r->op, r->dt, r->buf + off, r->fsrc ? r->fsrc + off : r->buf + off, src, len / es);
    }
}

static void protocol_error(Engine *e, peer_t *p, const char *msg) {
    if (!p->broken) {
        p->broken = 1;
        snprintf(e->err, sizeof e->err, "from rank %d: %s", p->rank, msg);
    }
}

/* the first posted receive of `p` with `tag` (removed from the list), or NULL */
static req_t *take_posted(peer_t *p, uint32_t tag) {
    req_t **pp = &p->posted;
    while (*pp) {
        if ((*pp)->tag == tag) {
            req_t *r = *pp;
            *pp = r->next;
            r->next = NULL;
            return r;
        }
        pp = &(*pp)->next;
    }
    return NULL;
}

/* a tag's space: bits 24-30 when bit 31 is clear (backends/sockets.py SPACE_SHIFT), 0 for none */
static inline uint32_t tag_space(uint32_t tag) { return (tag >> 31) ? 0 : (tag >> 24) & 0x7Fu; }

/* the peer of a posted receive (held == 0) or of an early message not yet taken (held == 1)
 * that is in `tag`'s nonzero space but of a plan other than `plan` (its plan in *other), or
 * NULL: within one space every rank runs one plan, so such a pair means the ranks issued
 * different calls in one position of their order (hcc/collectives.py) */
static peer_t *space_clash(Engine *e, uint32_t tag, uint32_t plan, int held, uint32_t *other) {
    uint32_t sp = tag_space(tag);
    if (!sp) return NULL;
    for (int k = 0; k < e->npeers; k++) {
        peer_t *q = &e->peers[k];
        if (held) {
            for (held_t *h = q->held; h; h = h->next)
                if (!h->waiter && tag_space(h->tag) == sp && h->plan != plan) {
                    *other = h->plan;
                    return q;
                }
        } else {
            for (req_t *r = q->posted; r; r = r->next)
                if (tag_space(r->tag) == sp && r->plan != plan) {
                    *other = r->plan;
                    return q;
                }
        }
    }
    return NULL;
}

/* consume the pieces waiting in p's inbound ring; returns how many */
static int drain_in(Engine *e, peer_t *p) {
    int moved = 0;
    const uint64_t cap = ring_cap(e);
    while (!p->broken) {
        uint64_t head = atomic_load_explicit(&p->in->head, memory_order_acquire);
        if (head == p->in_tail) break;
        if (head - p->in_tail > cap) {
            protocol_error(e, p, "ring head ahead of its capacity");
            break;
        }
        uint64_t pos = p->in_tail % cap;
        char *slot = p->in_slots + pos;
        slot_hdr_t h;
        memcpy(&h, slot, sizeof h); /* checked after the copy: the peer cannot change it under us */
        if (h.pad == PIECE_SKIP) { /* the writer wrapped: the rest of the ring is padding */
            if (pos == 0 || head - p->in_tail < cap - pos) {
                protocol_error(e, p, "bad ring padding");
                break;
            }
            p->in_tail += cap - pos;
            atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
            continue;
        }
        const char *data = slot + SLOT_HDR;
        uint64_t span = piece_span(h.len);
        if (h.len > e->slot_bytes || h.offset > h.msg_len || h.len > h.msg_len - h.offset || pos + span > cap ||
            head - p->in_tail < span) {
            protocol_error(e, p, "piece outside its message or its ring");
            break;
        }
        if (!p->cur_active) {
            if (h.offset != 0) {
                protocol_error(e, p, "message does not start at offset 0");
                break;
            }
            req_t *r = take_posted(p, h.tag);
            if (r) {
                if (r->plan != h.plan) {
                    snprintf(e->err, sizeof e->err,
                             "from rank %d: message tag %u belongs to plan %08x, the posted receive to plan %08x: "
                             "the ranks are running different plans", p->rank, h.tag, h.plan, r->plan);
                    p->broken = 1;
                    break;
                }
                if (r->nbytes != h.msg_len) {
                    snprintf(e->err, sizeof e->err,
                             "from rank %d: message tag %u has %llu bytes, the posted receive expects %zu",
                             p->rank, h.tag, (unsigned long long)h.msg_len, r->nbytes);
                    p->broken = 1;
                    break;
                }
                p->cur = r;
                p->cur_held = NULL;
            } else {
                uint32_t other = 0;
                peer_t *q = space_clash(e, h.tag, h.plan, 0, &other);
                if (q) { /* both peers fail: the one a receive waits on ends the run at once */
                    snprintf(e->err, sizeof e->err,
                             "from rank %d: message tag %u belongs to plan %08x, this rank runs plan %08x in its "
                             "tag space %u: the ranks are running different plans as one call",
                             p->rank, h.tag, h.plan, other, tag_space(h.tag));
                    p->broken = 1;
                    q->broken = 1;
                    break;
                }
                if (h.msg_len > e->max_held) {
                    snprintf(e->err, sizeof e->err,
                             "from rank %d: early message of %llu bytes exceeds the bound of %zu bytes", p->rank,
                             (unsigned long long)h.msg_len, e->max_held);
                    p->broken = 1;
                    break;
                }
                held_t *hd = calloc(1, sizeof *hd);
                char *buf = h.msg_len ? malloc(h.msg_len) : NULL;
                if (!hd || (h.msg_len && !buf)) {
                    free(hd);
                    free(buf);
                    protocol_error(e, p, "out of memory holding an early message");
                    break;
                }
                hd->tag = h.tag;
                hd->plan = h.plan;
                hd->len = h.msg_len;
                hd->data = buf;
                held_t **pp = &p->held;
                while (*pp) pp = &(*pp)->next;
                *pp = hd;
                p->cur = NULL;
                p->cur_held = hd;
            }
            p->cur_active = 1;
            p->cur_tag = h.tag;
            p->cur_plan = h.plan;
            p->cur_len = h.msg_len;
            p->cur_off = 0;
        } else if (h.tag != p->cur_tag || h.offset != p->cur_off || h.msg_len != p->cur_len) {
            protocol_error(e, p, "piece out of order");
            break;
        }
        if (p->cur)
            land(p->cur, h.offset, data, h.len);
        else if (h.len)
            memcpy(p->cur_held->data + h.offset, data, h.len);
        p->cur_off += h.len;
        p->in_tail += span;
        atomic_store_explicit(&p->in->tail, p->in_tail, memory_order_release);
        moved++;
        if (p->cur_off == p->cur_len) {
            p->cur_active = 0;
            if (p->cur) {
                req_t *r = p->cur;
                p->cur = NULL;
                complete_req(e, r);
            } else {
                held_t *hd = p->cur_held;
                p->cur_held = NULL;
                hd->complete = 1;
                hd->got = hd->len;
                if (hd->waiter) { /* its receive was posted while it arrived */
                    req_t *r = hd->waiter;
                    land(r, 0, hd->data, hd->len);
                    held_t **pp = &p->held;
                    while (*pp != hd) pp = &(*pp)->next;
                    *pp = hd->next;
                    free(hd->data);
                    free(hd);
                    complete_req(e, r);
                }
            }
        }
    }
    if (moved) ring_bell(p);
    return moved;
}

/* publish the next pieces of p's queued sends while slots are free; returns how many */
static int fill_out(Engine *e, peer_t *p) {
    int moved = 0;
    const uint64_t cap = ring_cap(e);
    uint64_t tail = atomic_load_explicit(&p->out->tail, memory_order_acquire);
    while (p->sq_head) {
        req_t *r = p->sq_head;
        size_t len = r->nbytes - r->moved;
        if (len > e->slot_bytes) len = e->slot_bytes;
        uint64_t span = piece_span(len);
        uint64_t pos = p->out_head % cap;
        uint64_t pad = pos + span > cap ? cap - pos : 0; /* a piece never wraps: pad to the end */
        if (p->out_head + pad + span - tail > cap) {
            tail = atomic_load_explicit(&p->out->tail, memory_order_acquire);
            if (p->out_head + pad + span - tail > cap) break;
        }
        if (pad) {
            slot_hdr_t skip = {0, 0, 0, 0, 0, PIECE_SKIP, {0, 0, 0, 0}};
            memcpy(p->out_slots + pos, &skip, sizeof skip);
            p->out_head += pad;
            pos = 0;
        }
        char *slot = p->out_slots + pos;
        slot_hdr_t h = {r->tag, r->plan, r->nbytes, r->moved, (uint32_t)len, 0, {0, 0, 0, 0}};
        memcpy(slot, &h, sizeof h);
        if (len) memcpy(slot + SLOT_HDR, (r->owned ? r->owned : r->buf) + r->moved, len);
        p->out_head += span;
        atomic_store_explicit(&p->out->head, p->out_head, memory_order_release);
        r->moved += len;
        moved++;
        if (r->moved == r->nbytes) {
            p->sq_head = r->next;
            if (!p->sq_head) p->sq_tail = NULL;
            r->next = NULL;
            complete_req(e, r);
        }
    }
    if (moved) ring_bell(p);
    return moved;
}

static int progress(Engine *e) {
    int moved = 0;
    for (int i = 0; i < e->npeers; i++) {
        peer_t *p = &e->peers[i];
        if (p->broken) continue;
        moved += drain_in(e, p);
        if (p->dead != 1) moved += fill_out(e, p);
    }
    return moved;
}

/* post: call with the mutex held */
static void post_send(Engine *e, req_t *r) {
    peer_t *p = &e->peers[r->peer];
    p->outstanding++;
    r->next = NULL;
    if (p->sq_tail)
        p->sq_tail->next = r;
    else
        p->sq_head = r;
    p->sq_tail = r;
    fill_out(e, p);
}

static void post_recv(Engine *e, req_t *r) {
    peer_t *p = &e->peers[r->peer];
    p->outstanding++;
    r->next = NULL;
    uint32_t other = 0;
    peer_t *from = space_clash(e, r->tag, r->plan, 1, &other);
    if (from) {
        snprintf(e->err, sizeof e->err,
                 "from rank %d: a message of plan %08x arrived in tag space %u, where this rank receives "
                 "for plan %08x: the ranks are running different plans as one call",
                 from->rank, other, tag_space(r->tag), r->plan);
        p->broken = 1;
        from->broken = 1;
        return;
    }
    held_t **pp = &p->held;
    while (*pp) {
        held_t *hd = *pp;
        if (hd->tag == r->tag && !hd->waiter) {
            if (hd->plan != r->plan) {
                snprintf(e->err, sizeof e->err,
                         "from rank %d: tag %u was sent for plan %08x, this rank receives it for plan %08x: "
                         "the ranks are running different plans", p->rank, r->tag, hd->plan, r->plan);
                p->broken = 1;
                return;
            }
            if (hd->len != r->nbytes) {
                snprintf(e->err, sizeof e->err, "from rank %d: tag %u has %zu bytes, the receive expects %zu",
                         p->rank, r->tag, hd->len, r->nbytes);
                p->broken = 1;
                return;
            }
            if (hd->complete) {
                *pp = hd->next;
                land(r, 0, hd->data, hd->len);
                free(hd->data);
                free(hd);
                complete_req(e, r);
            } else {
                hd->waiter = r;
            }
            return;
        }
        pp = &hd->next;
    }
    req_t **q = &p->posted;
    while (*q) q = &(*q)->next;
    *q = r;
}

/* check the unix sockets of peers whose socket is readable: EOF = gone (closed cleanly when
 * its bell says so); returns 1 when a peer's state changed */
static int check_peers(Engine *e, struct pollfd *fds, int nfds_peers) {
    int changed = 0;
    for (int i = 0; i < nfds_peers; i++) {
        if (!fds[i].revents) continue;
        peer_t *p = NULL;
        for (int k = 0; k < e->npeers; k++)
            if (e->peers[k].sock == fds[i].fd) p = &e->peers[k];
        if (!p || p->dead) continue;
        char b[16];
        ssize_t got = recv(p->sock, b, sizeof b, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            p->dead = atomic_load(&p->bell->closed) ? 2 : 1;
            changed = 1;
        }
    }
    return changed;
}

/* the unix sockets of the live peers as pollfds (POLLIN: EOF = gone); returns how many */
static int peer_pollfds(Engine *e, struct pollfd *fds) {
    int n = 0;
    for (int k = 0; k < e->npeers; k++)
        if (!e->peers[k].dead) {
            fds[n].fd = e->peers[k].sock;
            fds[n].events = POLLIN;
            fds[n].revents = 0;
            n++;
        }
    return n;
}

/* sleep until a bell rings, a peer socket changes, or `left` seconds pass (bounded spin first) */
static void nap(Engine *e, uint32_t seq0, double left, int interruptible) {
    for (int i = 0; i < e->spin; i++) {
        if (atomic_load(&e->bell->seq) != seq0 || (interruptible && atomic_load(&e->interrupt))) return;
        CPU_RELAX();
    }
    struct pollfd fds[e->npeers + 1];
    int n = peer_pollfds(e, fds);
    fds[n].fd = e->evfd;
    fds[n].events = POLLIN;
    fds[n].revents = 0;
    atomic_store(&e->bell->sleeping, 1);
    if (atomic_load(&e->bell->seq) == seq0 && !(interruptible && atomic_load(&e->interrupt))) {
        int ms = (int)(left * 1000.0) + 1;
        if (ms > 1000) ms = 1000;
        double t0 = now_s();
        poll(fds, n + 1, ms);
        e->naps++;
        e->nap_ns += (uint64_t)((now_s() - t0) * 1e9);
    }
    atomic_store(&e->bell->sleeping, 0);
    uint64_t v;
    ssize_t r = read(e->evfd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&e->mu);
    check_peers(e, fds, n);
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------------------ Engine type */
static void engine_release(Engine *e) {
    if (e->seg && e->seg != MAP_FAILED) munmap(e->seg, e->seg_size);
    e->seg = NULL;
    if (e->peer_segs) {
        for (int i = 0; i < e->npeers; i++)
            if (e->peer_segs[i] && e->peer_segs[i] != MAP_FAILED) munmap(e->peer_segs[i], e->peer_seg_sizes[i]);
        free(e->peer_segs);
        e->peer_segs = NULL;
    }
    free(e->peer_seg_sizes);
    e->peer_seg_sizes = NULL;
    if (e->peers) {
        for (int i = 0; i < e->npeers; i++) {
            peer_t *p = &e->peers[i];
            held_t *h = p->held;
            while (h) {
                held_t *nx = h->next;
                free(h->data);
                free(h);
                h = nx;
            }
            if (p->evfd >= 0) close(p->evfd);
            if (p->sock >= 0) close(p->sock);
        }
        free(e->peers);
        e->peers = NULL;
    }
    if (e->evfd >= 0) close(e->evfd);
    e->evfd = -1;
    if (e->table) {
        for (int64_t i = 0; i < e->table_len; i++) free(e->table[i]);
        free(e->table);
        e->table = NULL;
    }
    free(e->rdone);
    e->rdone = NULL;
    free(e->xdone);
    e->xdone = NULL;
}

/* after close(), once no thread is inside wait/run (called with the GIL held) */
static void release_if_closed(Engine *e) {
    if (e->closed && !e->users && !e->released) {
        e->released = 1;
        engine_release(e);
    }
}

static void Engine_dealloc(Engine *e) {
    engine_release(e);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->xmu);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *Engine_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (!e) return NULL;
    e->evfd = -1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->xmu, NULL);
    return (PyObject *)e;
}

/* Engine(rank, seg_fd, seg_size, evfd, nslots, slot_bytes, spin, max_held, peers)
 * peers: list of (rank, seg_fd, seg_size, evfd, sock, out_index, in_index); the fds are
 * duplicated, the caller keeps (and closes) its own. out_index: the ring to this peer in our
 * segment; in_index: the ring to us in the peer's segment. */
static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    int rank, seg_fd, evfd, spin;
    Py_ssize_t seg_size, max_held;
    unsigned int nslots, slot_bytes;
    PyObject *peers;
    if (!PyArg_ParseTuple(args, "iiniIIinO", &rank, &seg_fd, &seg_size, &evfd, &nslots, &slot_bytes, &spin,
                          &max_held, &peers))
        return -1;
    if (e->seg) {
        PyErr_SetString(PyExc_RuntimeError, "Engine already initialised");
        return -1;
    }
    if (nslots < 2 || slot_bytes < 64 || slot_bytes % 64) {
        PyErr_SetString(PyExc_ValueError, "nslots >= 2 and slot_bytes a multiple of 64 are required");
        return -1;
    }
    PyObject *seq = PySequence_Fast(peers, "peers must be a sequence");
    if (!seq) return -1;
    Py_ssize_t np = PySequence_Fast_GET_SIZE(seq);
    e->rank = rank;
    e->nslots = nslots;
    e->slot_bytes = slot_bytes;
    e->spin = spin;
    e->max_held = (size_t)max_held;
    e->npeers = (int)np;
    e->peers = calloc(np ? np : 1, sizeof(peer_t));
    e->peer_segs = calloc(np ? np : 1, sizeof(char *));
    e->peer_seg_sizes = calloc(np ? np : 1, sizeof(size_t));
    if (!e->peers || !e->peer_segs || !e->peer_seg_sizes) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < np; i++) e->peers[i].evfd = e->peers[i].sock = -1;
    size_t stride = ring_stride(nslots, slot_bytes);
    e->seg_size = (size_t)seg_size;
    e->seg = mmap(NULL, e->seg_size, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
    if (e->seg == MAP_FAILED) {
        e->seg = NULL;
        Py_DECREF(seq);
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    e->bell = (bell_t *)e->seg;
    e->bell->magic = SEG_MAGIC;
    e->evfd = dup(evfd);
    for (Py_ssize_t i = 0; i < np; i++) {
        int prank, pfd, pev, psock;
        Py_ssize_t psize, out_index, in_index;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "iiniinn", &prank, &pfd, &psize, &pev, &psock,
                              &out_index, &in_index)) {
            Py_DECREF(seq);
            return -1;
        }
        if (BELL_BYTES + (size_t)(out_index + 1) * stride > e->seg_size ||
            BELL_BYTES + (size_t)(in_index + 1) * stride > (size_t)psize || out_index < 0 || in_index < 0) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "ring index outside the segment");
            return -1;
        }
        peer_t *p = &e->peers[i];
        p->rank = prank;
        char *ps = mmap(NULL, (size_t)psize, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
        if (ps == MAP_FAILED) {
            Py_DECREF(seq);
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        e->peer_segs[i] = ps;
        e->peer_seg_sizes[i] = (size_t)psize;
        if (((bell_t *)ps)->magic != SEG_MAGIC) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "rank %d's segment is not an hcc segment", prank);
            return -1;
        }
        p->bell = (bell_t *)ps;
        p->out = (ring_t *)(e->seg + BELL_BYTES + (size_t)out_index * stride);
        p->out_slots = (char *)p->out + sizeof(ring_t);
        p->in = (ring_t *)(ps + BELL_BYTES + (size_t)in_index * stride);
        p->in_slots = (char *)p->in + sizeof(ring_t);
        p->out_head = atomic_load(&p->out->head);
        p->in_tail = atomic_load(&p->in->tail);
        p->evfd = dup(pev);
        p->sock = dup(psock);
    }
    Py_DECREF(seq);
    int lo = rank;
    e->board = (_Atomic uint64_t *)(e->seg + BOARD_OFF);
    for (int i = 0; i < e->npeers; i++)
        if (e->peers[i].rank < lo) {
            lo = e->peers[i].rank;
            e->board = (_Atomic uint64_t *)(e->peer_segs[i] + BOARD_OFF);
        }
    return 0;
}

static PyObject *status_error(Engine *e, int status, int peer) {
    /* (status, peer, message) for the Python side to raise as a typed error */
    return Py_BuildValue("(iis)", status, peer, e->err);
}

/* the Python API --------------------------------------------------------------- */
static int64_t table_put(Engine *e, req_t *r) {
    for (int64_t i = 0; i < e->table_len; i++)
        if (!e->table[i]) {
            e->table[i] = r;
            return i;
        }
    int64_t nl = e->table_len ? e->table_len * 2 : 64;
    req_t **nt = realloc(e->table, nl * sizeof(req_t *));
    if (!nt) return -1;
    memset(nt + e->table_len, 0, (nl - e->table_len) * sizeof(req_t *));
    int64_t i = e->table_len;
    e->table = nt;
    e->table_len = nl;
    e->table[i] = r;
    return i;
}

static int check_peer_index(Engine *e, int peer) {
    if (peer < 0 || peer >= e->npeers || e->closed) {
        PyErr_SetString(PyExc_ValueError, e->closed ? "engine closed" : "no such local peer");
        return -1;
    }
    return 0;
}

/* post a send (R_SEND, a readable buffer) or a receive (R_RECV, a writable one):
   (peer_index, tag, plan, buffer) -> handle; the caller keeps the buffer alive until done */
static PyObject *post_request(Engine *e, PyObject *args, int kind) {
    int peer;
    unsigned int tag, plan;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, kind == R_SEND ? "iIIy*" : "iIIw*", &peer, &tag, &plan, &b)) return NULL;
    if (check_peer_index(e, peer)) {
        PyBuffer_Release(&b);
        return NULL;
    }
    req_t *r = calloc(1, sizeof *r);
    if (!r) {
        PyBuffer_Release(&b);
        return PyErr_NoMemory();
    }
    r->kind = kind;
    r->peer = peer;
    r->tag = tag;
    r->plan = plan;
    r->buf = b.buf;
    r->nbytes = (size_t)b.len;
    PyBuffer_Release(&b);
    pthread_mutex_lock(&e->mu);
    int64_t h = table_put(e, r);
    r->id = h | ((int64_t)1 << 62);
    if (kind == R_SEND)
        post_send(e, r);
    else
        post_recv(e, r);
    pthread_mutex_unlock(&e->mu);
    return PyLong_FromLongLong(h);
}

static PyObject *Engine_isend(Engine *e, PyObject *args) { return post_request(e, args, R_SEND); }

static PyObject *Engine_irecv(Engine *e, PyObject *args) { return post_request(e, args, R_RECV); }

/* failure of a peer that some request in `peers_busy` depends on: (status, peer) or 0 */
static int failure_of(Engine *e, const char *busy, int *peer_out) {
    for (int k = 0; k < e->npeers; k++) {
        if (!busy[k]) continue;
        peer_t *p = &e->peers[k];
        if (p->broken) {
            *peer_out = p->rank;
            return 3;
        }
        if (p->dead == 1) {
            *peer_out = p->rank;
            return 2;
        }
        /* the peer stopped (or will) because a rank it depends on died: name that rank, as
         * the sockets transport's FAIL frames do */
        uint32_t v = atomic_load(&p->bell->failed_rank);
        if (v && (int)(v - 1) != e->rank && v <= (1u << 24)) {
            *peer_out = (int)(v - 1);
            snprintf(e->err, sizeof e->err, "reported by rank %d", p->rank);
            return 6;
        }
        if (p->dead) {
            *peer_out = p->rank;
            return 4;
        }
    }
    return 0;
}

/* wait(handles, timeout) -> (completed handles, status, peer, message): returns once at least
 * one handle of `handles` is done (all done ones are reported and released), after `timeout`
 * seconds (status 1), when a peer a waited request depends on failed (2 died, 4 closed, 3
 * protocol error), or when interrupt() was called (status 5). */
static PyObject *Engine_wait(Engine *e, PyObject *args) {
    PyObject *handles;
    double timeout;
    if (!PyArg_ParseTuple(args, "Od", &handles, &timeout)) return NULL;
    if (e->released) {
        PyErr_SetString(PyExc_RuntimeError, "engine closed");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(handles, "handles must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int64_t *hs = malloc((n ? n : 1) * sizeof(int64_t));
    char *busy = calloc(e->npeers ? e->npeers : 1, 1);
    if (!hs || !busy) {
        free(hs);
        free(busy);
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        hs[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (hs[i] < 0 || hs[i] >= e->table_len || !e->table[hs[i]]) {
            free(hs);
            free(busy);
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "unknown request handle");
            return NULL;
        }
        busy[e->table[hs[i]]->peer] = 1;
    }
    Py_DECREF(seq);
    int status = 0, fpeer = -1;
    double deadline = now_s() + timeout;
    int any = 0;
    e->users++;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        uint32_t seq0 = atomic_load(&e->bell->seq);
        pthread_mutex_lock(&e->mu);
        progress(e);
        for (Py_ssize_t i = 0; i < n && !any; i++) any = !e->table[hs[i]] || e->table[hs[i]]->done;
        if (!any) status = failure_of(e, busy, &fpeer);
        pthread_mutex_unlock(&e->mu);
        if (any || status) break;
        if (atomic_exchange(&e->interrupt, 0)) {
            status = 5;
            break;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            status = 1;
            break;
        }
        nap(e, seq0, left, 1);
    }
    Py_END_ALLOW_THREADS
    e->users--;
    PyObject *done = PyList_New(0);
    for (Py_ssize_t i = 0; i < n && done; i++) {
        req_t *r = e->table[hs[i]];
        if (r && r->done) {
            PyObject *v = PyLong_FromLongLong(hs[i]);
            PyList_Append(done, v);
            Py_DECREF(v);
        }
    }
    free(hs);
    free(busy);
    release_if_closed(e);
    if (!done) return NULL;
    PyObject *res = Py_BuildValue("(Niis)", done, status, fpeer, (status == 3 || status == 6) ? e->err : "");
    return res;
}

/* done(handle) -> bool; release(handle): forget a completed request */
static PyObject *Engine_done(Engine *e, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    if (e->released || h < 0 || h >= e->table_len || !e->table[h]) Py_RETURN_TRUE;
    return PyBool_FromLong(e->table[h]->done);
}

static PyObject *Engine_release(Engine *e, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    pthread_mutex_lock(&e->mu);
    if (!e->released && h >= 0 && h < e->table_len && e->table[h] && e->table[h]->done) {
        free(e->table[h]);
        e->table[h] = NULL;
    }
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

static PyObject *Engine_poll(Engine *e, PyObject *noargs) {
    /* one progress pass and a look at the peers' sockets, without sleeping */
    if (e->released) Py_RETURN_NONE;
    pthread_mutex_lock(&e->mu);
    progress(e);
    struct pollfd fds[e->npeers + 1];
    int n = peer_pollfds(e, fds);
    if (n) poll(fds, n, 0);
    check_peers(e, fds, n);
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

static PyObject *Engine_interrupt(Engine *e, PyObject *noargs) {
    if (e->released) Py_RETURN_NONE;
    atomic_store(&e->interrupt, 1);
    atomic_fetch_add(&e->bell->seq, 1);
    uint64_t one = 1;
    ssize_t w = write(e->evfd, &one, sizeof one);
    (void)w;
    Py_RETURN_NONE;
}

/* set_failed(rank): publish in our bell that `rank` died (the first one only), and wake the
 * peers so that a rank blocked on us learns it */
static PyObject *Engine_set_failed(Engine *e, PyObject *args) {
    int r;
    if (!PyArg_ParseTuple(args, "i", &r)) return NULL;
    if (e->released || r < 0) Py_RETURN_NONE;
    uint32_t expect = 0;
    atomic_compare_exchange_strong(&e->bell->failed_rank, &expect, (uint32_t)r + 1);
    for (int k = 0; k < e->npeers; k++)
        if (e->peers[k].bell) ring_bell(&e->peers[k]);
    Py_RETURN_NONE;
}

/* reported() -> {peer rank: the rank it says died} */
static PyObject *Engine_reported(Engine *e, PyObject *noargs) {
    PyObject *d = PyDict_New();
    if (!d || e->released) return d;
    for (int k = 0; k < e->npeers; k++) {
        uint32_t v = atomic_load(&e->peers[k].bell->failed_rank);
        if (v && v <= (1u << 24)) {
            PyObject *key = PyLong_FromLong(e->peers[k].rank), *val = PyLong_FromLong((long)v - 1);
            PyDict_SetItem(d, key, val);
            Py_DECREF(key);
            Py_DECREF(val);
        }
    }
    return d;
}

/* dead() -> {rank: 1 died | 2 closed cleanly | 3 protocol error} */
static PyObject *Engine_dead(Engine *e, PyObject *noargs) {
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    for (int k = 0; e->peers && k < e->npeers; k++) {
        peer_t *p = &e->peers[k];
        int s = p->broken ? 3 : p->dead;
        if (s) {
            PyObject *key = PyLong_FromLong(p->rank), *v = PyLong_FromLong(s);
            PyDict_SetItem(d, key, v);
            Py_DECREF(key);
            Py_DECREF(v);
        }
    }
    return d;
}

static PyObject *Engine_close(Engine *e, PyObject *noargs) {
    if (e->closed) Py_RETURN_NONE;
    e->closed = 1;
    if (e->bell) atomic_store(&e->bell->closed, 1);
    for (int k = 0; k < e->npeers; k++) {
        peer_t *p = &e->peers[k];
        if (p->sock >= 0) {
            ssize_t w = send(p->sock, "B", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)w;
            shutdown(p->sock, SHUT_WR);
        }
        if (p->bell) ring_bell(p);
    }
    atomic_store(&e->interrupt, 1); /* a thread blocked in wait returns */
    if (e->evfd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(e->evfd, &one, sizeof one);
        (void)w;
    }
    release_if_closed(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_stats(Engine *e, PyObject *noargs) {
    int64_t held = 0;
    for (int k = 0; e->peers && k < e->npeers; k++)
        for (held_t *h = e->peers[k].held; h; h = h->next) held++;
    return Py_BuildValue("{s:K,s:K,s:L,s:K,s:d}", "messages", (unsigned long long)e->messages, "runs",
                         (unsigned long long)e->runs, "held", (long long)held, "naps", (unsigned long long)e->naps,
                         "nap_s", e->nap_ns * 1e-9);
}

/* the program runner ------------------------------------------------------------ */
/* a run with transfers over TCP naps at most this long between asking Python whether a TCP
 * peer failed: their completions wake it at once (ext_done), only a failure waits a slice */
#define EXT_SLICE_S 0.01

typedef struct {
    Engine *e;
    const int64_t *ops;
    const int64_t *dep_ptr, *dep_idx;
    int32_t *missing;
    char *bufs[3];
    req_t *reqs;
    int op, dt;
    uint32_t plan;
    int64_t n_ops;
    int64_t completed;
    int64_t *stack;
    int64_t sp;
    /* external transfers (field 9 set: the peer, field 1, is a rank over TCP): the ones that
     * became ready, for Python to post (with the GIL, outside the mutex), and how many of
     * them are posted and not complete */
    int64_t *xready;
    int64_t nxready;
    int64_t ext_out;
} runner_t;

/* the rank a transfer op talks to: field 1 is a local peer index, or a rank (external) */
static inline int op_peer_rank(Engine *e, const int64_t *f) { return f[9] ? (int)f[1] : e->peers[f[1]].rank; }

static inline char *at(runner_t *R, int64_t buf, int64_t off) { return R->bufs[buf] + off; }

/* run op k and, depth first, every local op it releases; transfers are posted */
static void run_from(runner_t *R, int64_t k0) {
    Engine *e = R->e;
    R->stack[R->sp++] = k0;
    while (R->sp) {
        int64_t k = R->stack[--R->sp];
        const int64_t *f = R->ops + k * NF;
        int kind = (int)f[0];
        if (kind == K_SEND || kind == K_RECV || kind == K_RECV_REDUCE) {
            req_t *r = &R->reqs[k];
            memset(r, 0, sizeof *r);
            if (f[9]) { /* over TCP: Python posts it once the mutex is released */
                r->id = k;
                r->kind = kind == K_SEND ? R_SEND : kind == K_RECV ? R_RECV : R_RECV_REDUCE;
                R->xready[R->nxready++] = k;
                continue;
            }
            r->kind = kind == K_SEND ? R_SEND : kind == K_RECV ? R_RECV : R_RECV_REDUCE;
            r->peer = (int)f[1];
            r->tag = (uint32_t)f[2];
            r->plan = R->plan;
            r->buf = at(R, f[3], f[4]);
            r->nbytes = (size_t)f[5];
            r->fsrc = f[6] >= 0 ? at(R, f[6], f[7]) : NULL;
            r->op = R->op;
            r->dt = R->dt;
            r->id = k;
            if (kind == K_SEND)
                post_send(e, r);
            else
                post_recv(e, r);
            continue;
        }
        prog_local(f, R->bufs, R->op, R->dt, DT_SIZE[R->dt], combine, scale, NULL);
        R->completed++;
        for (int64_t j = R->dep_ptr[k]; j < R->dep_ptr[k + 1]; j++) {
            int64_t d = R->dep_idx[j];
            if (--R->missing[d] == 0) R->stack[R->sp++] = d;
        }
    }
}

/* a run that stops early leaves nothing of its own behind: queued sends not yet started and
 * posted receives are dropped, a send half way through finishes from a private copy of its
 * rest, and a receive half way through discards the rest of its message */
static void abandon(runner_t *R, int64_t n_ops) {
    Engine *e = R->e;
    for (int k = 0; k < e->npeers; k++) {
        peer_t *p = &e->peers[k];
        req_t **pp = &p->posted;
        while (*pp) {
            req_t *r = *pp;
            if (r >= R->reqs && r < R->reqs + n_ops) {
                *pp = r->next;
                p->outstanding--;
            } else {
                pp = &r->next;
            }
        }
        if (p->cur >= R->reqs && p->cur < R->reqs + n_ops) {
            req_t *c = malloc(sizeof *c);
            if (c) {
                *c = *p->cur;
                c->discard = 1;
            }
            p->cur = c; /* NULL: the held path never sees it; the piece checks stop the stream */
            if (!c) p->broken = 1;
        }
        for (held_t *h = p->held; h; h = h->next)
            if (h->waiter >= R->reqs && h->waiter < R->reqs + n_ops) {
                h->waiter = NULL;
                p->outstanding--;
            }
        /* sends: rebuild the queue */
        req_t *q = p->sq_head, *nh = NULL, *nt = NULL;
        while (q) {
            req_t *nx = q->next;
            req_t *keep = q;
            if (q >= R->reqs && q < R->reqs + n_ops) {
                if (q->moved == 0) {
                    keep = NULL;
                    p->outstanding--;
                } else {
                    keep = malloc(sizeof *keep);
                    char *rest = keep ? malloc(q->nbytes) : NULL;
                    if (!keep || !rest) {
                        free(keep);
                        keep = NULL;
                        p->broken = 1;
                    } else {
                        *keep = *q;
                        memcpy(rest, q->buf, q->nbytes);
                        keep->owned = rest;
                        keep->buf = rest;
                    }
                }
            }
            if (keep) {
                keep->next = NULL;
                if (nt)
                    nt->next = keep;
                else
                    nh = keep;
                nt = keep;
            }
            q = nx;
        }
        p->sq_head = nh;
        p->sq_tail = nt;
    }
}

/* run(ops, dep_ptr, dep_idx, missing, first, in, out, tmp, op, dtype, plan, timeout[, post, check])
 *   -> (status, op index, peer rank, message): status 0 done, 1 timeout (op: the oldest
 *   outstanding receive, else send), 2 peer died, 3 protocol error, 4 peer closed, 6 a peer
 *   reported that the rank named died, 7 check() returned the object in `message`.
 * External transfers (field 9 set; a mixed job's peers over TCP): the runner calls
 * post(gen, k) with the GIL when op k becomes ready; Python posts it on its transport and
 * reports its completion with ext_done(gen, k) (an external RecvReduce reduces its pieces
 * with fold(gen, k, ...)). While such transfers are outstanding and nothing moves, the
 * runner calls check() (None, or what to return as status 7: a TCP peer failed). An
 * exception in a callback ends the run and is raised.
 * Gate (gate_slot >= 0; the adaptive fast path, backends/adaptive/fast.py): before posting
 * anything the runner waits, napping, until board slot gate_slot reaches gate_target; a value
 * of exactly one multiple of it (the static decision) starts the program, any other value,
 * or gate_wait seconds without one, returns status 9 with nothing posted. Waiting here, not
 * in board_wait, leaves no Python turn between the decision and the first send (the turn
 * measured 69-106 us median per rank on this 2-core machine under load). 
 * Releases the GIL for the whole run. */
static int board_slot(Engine *e, long slot);

static PyObject *Engine_run(Engine *e, PyObject *args) {
    Py_buffer ops, dptr, didx, miss, first, bin = {0}, bout = {0}, btmp = {0};
    PyObject *oin, *oout, *otmp, *post_cb = Py_None, *check_cb = Py_None;
    int op, dt;
    unsigned int plan;
    double timeout, gate_wait = 0.0;
    long gate_slot = -1;
    unsigned long long gate_target = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*OOOiiId|OOlKd", &ops, &dptr, &didx, &miss, &first, &oin, &oout, &otmp, &op,
                          &dt, &plan, &timeout, &post_cb, &check_cb, &gate_slot, &gate_target, &gate_wait))
        return NULL;
    PyObject *result = NULL;
    int got_in = 0, got_out = 0, got_tmp = 0;
    if (e->closed || e->in_runner) {
        PyErr_SetString(PyExc_RuntimeError, e->closed ? "engine closed" : "a run is already in progress");
        goto out;
    }
    if (op < 0 || op >= OP_COUNT || dt < 0 || dt >= DT_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown op or dtype code");
        goto out;
    }
    if (gate_slot >= 0 && (board_slot(e, gate_slot) || !gate_target)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a gate needs a target above 0");
        goto out;
    }
    if (oin != Py_None) {
        if (PyObject_GetBuffer(oin, &bin, PyBUF_SIMPLE) < 0) goto out;
        got_in = 1;
    }
    if (oout != Py_None) {
        if (PyObject_GetBuffer(oout, &bout, PyBUF_WRITABLE) < 0) goto out;
        got_out = 1;
    }
    if (otmp != Py_None) {
        if (PyObject_GetBuffer(otmp, &btmp, PyBUF_WRITABLE) < 0) goto out;
        got_tmp = 1;
    }
    int64_t n_ops = ops.len / (int64_t)(NF * sizeof(int64_t));
    if (ops.len != n_ops * (Py_ssize_t)(NF * sizeof(int64_t)) || dptr.len != (n_ops + 1) * 8 ||
        miss.len != n_ops * 4) {
        PyErr_SetString(PyExc_ValueError, "malformed program arrays");
        goto out;
    }
    const int64_t *O = ops.buf;
    Py_ssize_t sizes[3] = {got_in ? bin.len : 0, got_out ? bout.len : 0, got_tmp ? btmp.len : 0};
    int ro_in = got_in && bin.readonly;
    const int64_t *DP = dptr.buf;
    if (didx.len % 8 || prog_check(O, n_ops, sizes, ro_in, DT_SIZE[dt], DP, didx.buf, didx.len / 8, first.buf,
                                   first.len / 8))
        goto bad;
    for (int64_t k = 0; k < n_ops; k++) { /* every peer known */
        const int64_t *f = O + k * NF;
        if (f[0] <= K_RECV_REDUCE && !f[9] && (f[1] < 0 || f[1] >= e->npeers)) goto bad;
        if (f[0] <= K_RECV_REDUCE && f[9] && (f[1] < 0 || !PyCallable_Check(post_cb))) goto bad;
    }
    {
        runner_t R;
        memset(&R, 0, sizeof R);
        R.e = e;
        R.ops = O;
        R.dep_ptr = DP;
        R.dep_idx = didx.buf;
        R.n_ops = n_ops;
        R.missing = malloc((n_ops ? n_ops : 1) * sizeof(int32_t));
        R.reqs = calloc(n_ops ? n_ops : 1, sizeof(req_t));
        R.stack = malloc((n_ops + 1) * sizeof(int64_t));
        R.xready = malloc((n_ops + 1) * sizeof(int64_t));
        int64_t *xtaken = malloc((n_ops + 1) * sizeof(int64_t));
        if (!R.missing || !R.reqs || !R.stack || !R.xready || !xtaken) {
            free(R.missing);
            free(R.reqs);
            free(R.stack);
            free(R.xready);
            free(xtaken);
            PyErr_NoMemory();
            goto out;
        }
        memcpy(R.missing, miss.buf, n_ops * sizeof(int32_t));
        for (int64_t k = 0; k < n_ops; k++) R.reqs[k].id = -1; /* not posted */
        R.bufs[0] = got_in ? bin.buf : NULL;
        R.bufs[1] = got_out ? bout.buf : NULL;
        R.bufs[2] = got_tmp ? btmp.buf : NULL;
        R.op = op;
        R.dt = dt;
        R.plan = plan;
        int64_t nfirst = first.len / 8;
        const int64_t *F = first.buf;
        int status = 0, fpeer = -1;
        int64_t fop = -1;
        PyObject *ext_fail = NULL;                      /* what check() returned (status 7) */
        PyObject *exc_t = NULL, *exc_v = NULL, *exc_tb = NULL; /* a callback raised (status 8) */
        char *busy = calloc(e->npeers ? e->npeers : 1, 1);
        pthread_mutex_lock(&e->xmu);
        uint64_t gen = ++e->run_gen;
        e->xdone_len = 0;
        pthread_mutex_unlock(&e->xmu);
        e->users++;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&e->mu);
        e->in_runner = 1;
        e->cur_run = &R;
        e->rdone_len = 0;
        if (gate_slot >= 0) { /* the gate (see run's comment): nothing is posted before it opens */
            pthread_mutex_unlock(&e->mu);
            double gate_end = now_s() + gate_wait;
            for (;;) {
                uint32_t seq0 = atomic_load(&e->bell->seq);
                uint64_t v = atomic_load(&e->board[gate_slot]);
                if (v >= gate_target) {
                    if (v / gate_target != 1) status = 9;
                    break;
                }
                double left = gate_end - now_s();
                if (left <= 0 || e->closed) {
                    status = 9;
                    break;
                }
                nap(e, seq0, left, 0);
            }
            pthread_mutex_lock(&e->mu);
        }
        for (int64_t i = 0; i < nfirst && !status; i++)
            if (R.missing[F[i]] == 0) run_from(&R, F[i]);
        pthread_mutex_unlock(&e->mu);
        double last = now_s();
        while (!status) {
            /* the external transfers that became ready: Python posts them over TCP */
            if (R.nxready) {
                int64_t nx = R.nxready;
                R.nxready = 0;
                Py_BLOCK_THREADS
                for (int64_t i = 0; i < nx && !status; i++) {
                    PyObject *res = PyObject_CallFunction(post_cb, "KL", (unsigned long long)gen,
                                                          (long long)R.xready[i]);
                    if (!res) {
                        PyErr_Fetch(&exc_t, &exc_v, &exc_tb);
                        status = 8;
                        fop = R.xready[i];
                    } else {
                        Py_DECREF(res);
                        R.ext_out++;
                    }
                }
                Py_UNBLOCK_THREADS
                if (status) break;
                last = now_s();
            }
            if (R.completed >= n_ops) break;
            uint32_t seq0 = atomic_load(&e->bell->seq);
            pthread_mutex_lock(&e->mu);
            int moved = progress(e);
            int64_t nd = e->rdone_len;
            for (int64_t i = 0; i < e->rdone_len; i++) {
                int64_t k = e->rdone[i];
                R.completed++;
                for (int64_t j = DP[k]; j < DP[k + 1]; j++) {
                    int64_t d = R.dep_idx[j];
                    if (--R.missing[d] == 0) run_from(&R, d);
                }
            }
            e->rdone_len = 0;
            int64_t nxt = 0;
            if (R.ext_out) { /* completions of external transfers (ext_done) */
                pthread_mutex_lock(&e->xmu);
                for (int64_t i = 0; i < e->xdone_len && nxt <= n_ops; i++) xtaken[nxt++] = e->xdone[i];
                e->xdone_len = 0;
                pthread_mutex_unlock(&e->xmu);
                for (int64_t i = 0; i < nxt; i++) {
                    int64_t k = xtaken[i];
                    if (k < 0 || k >= n_ops || !O[k * NF + 9] || R.reqs[k].id != k || R.reqs[k].done) continue;
                    R.reqs[k].done = 1;
                    R.ext_out--;
                    R.completed++;
                    nd++;
                    for (int64_t j = DP[k]; j < DP[k + 1]; j++) {
                        int64_t d = R.dep_idx[j];
                        if (--R.missing[d] == 0) run_from(&R, d);
                    }
                }
            }
            if (!moved && !nd && !R.nxready && R.completed < n_ops) {
                /* who are we waiting on: a failed peer there ends the run */
                memset(busy, 0, e->npeers ? e->npeers : 1);
                for (int k = 0; k < e->npeers; k++) {
                    peer_t *p = &e->peers[k];
                    if (p->sq_head || p->cur || p->broken) busy[k] = 1;
                    for (req_t *r = p->posted; r; r = r->next) busy[k] = 1;
                    for (held_t *h = p->held; h; h = h->next)
                        if (h->waiter) busy[k] = 1;
                }
                status = failure_of(e, busy, &fpeer);
            }
            pthread_mutex_unlock(&e->mu);
            if (status) break;
            if (moved || nd || R.nxready) {
                last = now_s();
                continue;
            }
            if (R.completed >= n_ops) break;
            if (R.ext_out && check_cb != Py_None) { /* a TCP peer of ours failed? (Python knows) */
                Py_BLOCK_THREADS
                PyObject *res = PyObject_CallNoArgs(check_cb);
                if (!res) {
                    PyErr_Fetch(&exc_t, &exc_v, &exc_tb);
                    status = 8;
                } else if (res != Py_None) {
                    ext_fail = res;
                    status = 7;
                } else {
                    Py_DECREF(res);
                }
                Py_UNBLOCK_THREADS
                if (status) break;
            }
            double left = last + timeout - now_s();
            if (left <= 0) {
                status = 1;
                break;
            }
            /* TCP completions wake us through ext_done; a failure over TCP is seen by check()
             * within this slice (the sockets transport's own failure detection bounds it) */
            nap(e, seq0, R.ext_out && left > EXT_SLICE_S ? EXT_SLICE_S : left, 0);
        }
        pthread_mutex_lock(&e->mu);
        if (status && status != 7 && status != 8 && status != 9) {
            /* blame: the oldest outstanding receive, else the oldest send */
            int64_t best_recv = -1, best_send = -1;
            for (int64_t k = 0; k < n_ops; k++) {
                int kind = (int)O[k * NF];
                if (kind > K_RECV_REDUCE || R.missing[k] != 0 || R.reqs[k].done || R.reqs[k].id != k) continue;
                if (kind == K_SEND) {
                    if (best_send < 0) best_send = k;
                } else if (best_recv < 0) {
                    best_recv = k;
                }
            }
            fop = best_recv >= 0 ? best_recv : best_send;
            if (status == 1 && fop >= 0) fpeer = op_peer_rank(e, O + fop * NF);
            if (status != 1 && fop >= 0) {
                /* name the op waiting on the failed peer when there is one */
                for (int64_t k = 0; k < n_ops; k++) {
                    int kind = (int)O[k * NF];
                    if (kind > K_RECV_REDUCE || R.missing[k] != 0 || R.reqs[k].done || R.reqs[k].id != k) continue;
                    if (op_peer_rank(e, O + k * NF) == fpeer) {
                        fop = k;
                        break;
                    }
                }
            }
        }
        if (status) abandon(&R, n_ops);
        e->in_runner = 0;
        e->cur_run = NULL;
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&e->xmu);
        e->run_gen++; /* a late ext_done or fold of this run is ignored */
        e->xdone_len = 0;
        pthread_mutex_unlock(&e->xmu);
        Py_END_ALLOW_THREADS
        e->users--;
        free(busy);
        free(R.missing);
        free(R.reqs);
        free(R.stack);
        free(R.xready);
        free(xtaken);
        if (status == 8) {
            PyErr_Restore(exc_t, exc_v, exc_tb);
        } else {
            if (!status) e->runs++;
            if (status == 7)
                result = Py_BuildValue("(iLiN)", status, (long long)fop, fpeer, ext_fail);
            else
                result = Py_BuildValue("(iLis)", status, (long long)fop, fpeer,
                                       (status == 3 || status == 6) ? e->err : "");
        }
    }
    goto out;
bad:
    PyErr_SetString(PyExc_ValueError, "program outside its buffers or peers (encode() and the buffers disagree)");
out:
    PyBuffer_Release(&ops);
    PyBuffer_Release(&dptr);
    PyBuffer_Release(&didx);
    PyBuffer_Release(&miss);
    PyBuffer_Release(&first);
    if (got_in) PyBuffer_Release(&bin);
    if (got_out) PyBuffer_Release(&bout);
    if (got_tmp) PyBuffer_Release(&btmp);
    release_if_closed(e);
    return result;
}

/* ext_done(gen, k): external transfer k of run `gen` completed (any thread, e.g. a TCP
 * reader's completion hook); a late call for a finished run is ignored */
static PyObject *Engine_ext_done(Engine *e, PyObject *args) {
    unsigned long long gen;
    long long k;
    if (!PyArg_ParseTuple(args, "KL", &gen, &k)) return NULL;
    if (e->released) Py_RETURN_NONE;
    int woke = 0;
    pthread_mutex_lock(&e->xmu);
    if (gen == e->run_gen && push_i64(&e->xdone, &e->xdone_len, &e->xdone_cap, k) == 0) woke = 1;
    pthread_mutex_unlock(&e->xmu);
    if (woke) wake_bell(e->bell, e->evfd);
    Py_RETURN_NONE;
}

/* fold(gen, k, offset, piece) -> bool: reduce `piece`, bytes [offset, offset + len) of the
 * message of external RecvReduce k of run `gen`, into its destination (from the fused Copy's
 * source when it has one), under the engine's mutex: the runner reduces into the same
 * blocks from the channels (a direct allreduce), and the two must not interleave. False
 * (nothing written) when that run is over. */
static PyObject *Engine_fold(Engine *e, PyObject *args) {
    unsigned long long gen;
    long long k, off;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "KLLy*", &gen, &k, &off, &b)) return NULL;
    int ok = 0, bad = 0;
    if (!e->released) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&e->mu);
        runner_t *R = (runner_t *)e->cur_run;
        if (R && gen == e->run_gen && k >= 0 && k < R->n_ops) {
            const int64_t *f = R->ops + k * NF;
            size_t es = DT_SIZE[R->dt];
            if (f[0] != K_RECV_REDUCE || !f[9] || off < 0 || (size_t)off % es || (size_t)b.len % es ||
                off + b.len > f[5]) {
                bad = 1;
            } else if (b.len) {
                char *d = R->bufs[f[3]] + f[4] + off;
                const char *a = f[6] >= 0 ? R->bufs[f[6]] + f[7] + off : d;
                combine(R->op, R->dt, d, a, b.buf, (size_t)b.len / es);
                ok = 1;
            } else {
                ok = 1;
            }
        }
        pthread_mutex_unlock(&e->mu);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "fold: piece outside its RecvReduce");
        return NULL;
    }
    return PyBool_FromLong(ok);
}

/* kick(): wake this rank's runner or wait (a TCP peer's state changed) */
static PyObject *Engine_kick(Engine *e, PyObject *noargs) {
    if (e->released) Py_RETURN_NONE;
    wake_bell(e->bell, e->evfd);
    Py_RETURN_NONE;
}

/* the board ------------------------------------------------------------------- */
static int board_slot(Engine *e, long slot) {
    if (e->released || !e->board || slot < 0 || slot >= BOARD_SLOTS) {
        PyErr_SetString(PyExc_ValueError, e->released ? "engine closed" : "no such board slot");
        return -1;
    }
    return 0;
}

/* board_add(slot, amount, wake) -> the new value; with `wake` the local peers are woken (a
 * waiter re-reads). Only an add a waiter waits for should wake: a sleeping peer's wake-up is
 * an eventfd write, and on a loaded 2-core machine the writer often loses its core to the
 * woken one (an add that rang every bell measured ~180 us, one that rings none ~1 us). */
static PyObject *Engine_board_add(Engine *e, PyObject *args) {
    long slot;
    unsigned long long amount;
    int wake = 1;
    if (!PyArg_ParseTuple(args, "lK|p", &slot, &amount, &wake) || board_slot(e, slot)) return NULL;
    uint64_t v = atomic_fetch_add(&e->board[slot], (uint64_t)amount) + (uint64_t)amount;
    for (int k = 0; wake && k < e->npeers; k++)
        if (!e->peers[k].dead) ring_bell(&e->peers[k]);
    return PyLong_FromUnsignedLongLong(v);
}

/* board_set(slot, value) */
static PyObject *Engine_board_set(Engine *e, PyObject *args) {
    long slot;
    unsigned long long value;
    if (!PyArg_ParseTuple(args, "lK", &slot, &value) || board_slot(e, slot)) return NULL;
    atomic_store(&e->board[slot], (uint64_t)value);
    Py_RETURN_NONE;
}

/* board_wait(slot, at_least, timeout) -> (value, reached): the slot's value once it is
 * >= at_least, or after `timeout` seconds (reached False); GIL released, bounded spin, then
 * a nap on this rank's eventfd (board_add rings every local peer's bell) */
static PyObject *Engine_board_wait(Engine *e, PyObject *args) {
    long slot;
    unsigned long long target;
    double timeout;
    if (!PyArg_ParseTuple(args, "lKd", &slot, &target, &timeout) || board_slot(e, slot)) return NULL;
    uint64_t v;
    double deadline = now_s() + timeout;
    e->users++;
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        uint32_t seq0 = atomic_load(&e->bell->seq);
        v = atomic_load(&e->board[slot]);
        if (v >= target || e->closed) break;
        double left = deadline - now_s();
        if (left <= 0) break;
        nap(e, seq0, left, 0);
    }
    Py_END_ALLOW_THREADS
    e->users--;
    release_if_closed(e);
    return Py_BuildValue("(KO)", (unsigned long long)v, v >= target ? Py_True : Py_False);
}

static PyMethodDef Engine_methods[] = {
    {"board_add", (PyCFunction)Engine_board_add, METH_VARARGS, "board_add(slot, amount[, wake]) -> new value"},
    {"board_set", (PyCFunction)Engine_board_set, METH_VARARGS, "board_set(slot, value)"},
    {"board_wait", (PyCFunction)Engine_board_wait, METH_VARARGS,
     "board_wait(slot, at_least, timeout) -> (value, reached)"},
    {"ext_done", (PyCFunction)Engine_ext_done, METH_VARARGS, "ext_done(gen, k): external transfer k completed"},
    {"fold", (PyCFunction)Engine_fold, METH_VARARGS, "fold(gen, k, offset, piece) -> bool"},
    {"kick", (PyCFunction)Engine_kick, METH_NOARGS, "wake this rank's runner or wait"},
    {"isend", (PyCFunction)Engine_isend, METH_VARARGS, "isend(peer_index, tag, plan, buffer) -> handle"},
    {"irecv", (PyCFunction)Engine_irecv, METH_VARARGS, "irecv(peer_index, tag, plan, buffer) -> handle"},
    {"wait", (PyCFunction)Engine_wait, METH_VARARGS, "wait(handles, timeout) -> (done, status, peer, message)"},
    {"done", (PyCFunction)Engine_done, METH_VARARGS, "done(handle) -> bool"},
    {"release", (PyCFunction)Engine_release, METH_VARARGS, "release(handle): forget a completed request"},
    {"poll", (PyCFunction)Engine_poll, METH_NOARGS, "one progress pass, no sleeping"},
    {"interrupt", (PyCFunction)Engine_interrupt, METH_NOARGS, "make a blocked wait return (status 5)"},
    {"dead", (PyCFunction)Engine_dead, METH_NOARGS, "{rank: 1 died, 2 closed, 3 protocol error}"},
    {"set_failed", (PyCFunction)Engine_set_failed, METH_VARARGS, "set_failed(rank): tell the peers rank died"},
    {"reported", (PyCFunction)Engine_reported, METH_NOARGS, "{peer rank: the rank it says died}"},
    {"close", (PyCFunction)Engine_close, METH_NOARGS, "mark this rank closed and tell the peers"},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "counters"},
    {"run", (PyCFunction)Engine_run, METH_VARARGS, "run one rank's encoded program (GIL released)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hcc.backends._native.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Engine_new,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
    .tp_doc = "The shared-memory channels of one rank to its local peers, and its program runner.",
};

/* ------------------------------------------------------------------ module functions */
/* combine(op, dtype, dst, a, b): dst = a (op) b, elementwise, GIL released */
static PyObject *py_combine(PyObject *self, PyObject *args) {
    int op, dt;
    Py_buffer d, a, b;
    if (!PyArg_ParseTuple(args, "iiw*y*y*", &op, &dt, &d, &a, &b)) return NULL;
    PyObject *res = NULL;
    if (op < 0 || op >= OP_COUNT || dt < 0 || dt >= DT_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown op or dtype code");
    } else if (d.len != a.len || d.len != b.len || d.len % DT_SIZE[dt]) {
        PyErr_SetString(PyExc_ValueError, "combine: lengths differ or are not whole elements");
    } else {
        Py_BEGIN_ALLOW_THREADS
        combine(op, dt, d.buf, a.buf, b.buf, (size_t)d.len / DT_SIZE[dt]);
        Py_END_ALLOW_THREADS
        res = Py_None;
        Py_INCREF(res);
    }
    PyBuffer_Release(&d);
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return res;
}

static PyObject *py_scale(PyObject *self, PyObject *args) {
    int dt;
    Py_buffer d;
    long long divisor;
    if (!PyArg_ParseTuple(args, "iw*L", &dt, &d, &divisor)) return NULL;
    PyObject *res = NULL;
    if (dt < 0 || dt >= DT_COUNT || divisor <= 0 || d.len % DT_SIZE[dt]) {
        PyErr_SetString(PyExc_ValueError, "scale: bad dtype, divisor or length");
    } else {
        Py_BEGIN_ALLOW_THREADS
        scale(dt, d.buf, (size_t)d.len / DT_SIZE[dt], divisor);
        Py_END_ALLOW_THREADS
        res = Py_None;
        Py_INCREF(res);
    }
    PyBuffer_Release(&d);
    return res;
}

static PyObject *py_ring_bytes(PyObject *self, PyObject *args) {
    unsigned int nslots, slot_bytes;
    if (!PyArg_ParseTuple(args, "II", &nslots, &slot_bytes)) return NULL;
    return PyLong_FromSize_t(ring_stride(nslots, slot_bytes));
}

static PyMethodDef module_methods[] = {
    {"combine", py_combine, METH_VARARGS, "combine(op, dtype, dst, a, b): dst = a (op) b"},
    {"scale", py_scale, METH_VARARGS, "scale(dtype, dst, divisor): dst /= divisor"},
    {"ring_bytes", py_ring_bytes, METH_VARARGS, "ring_bytes(nslots, slot_bytes): one ring's stride"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.backends._native",
                                       "The native core of hcc's runtime (see backends/native.py).", -1,
                                       module_methods};

/* the kernels, for the TCP core (backends/_native_tcp.c: PyCapsule_Import), which keeps none
 * of its own: both cores then reduce bit for bit alike */
typedef struct {
    int abi;
    void (*combine)(int, int, void *, const void *, const void *, size_t);
    void (*scale)(int, void *, size_t, int64_t);
} hcc_kernels_t;
static hcc_kernels_t KERNELS = {1, combine, scale};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    PyModule_AddObject(m, "_kernels", PyCapsule_New(&KERNELS, "hcc.backends._native._kernels", NULL));
    Py_INCREF(&EngineType);
    PyModule_AddObject(m, "Engine", (PyObject *)&EngineType);
    PyModule_AddIntConstant(m, "BELL_BYTES", BELL_BYTES);
    PyModule_AddIntConstant(m, "BOARD_SLOTS", BOARD_SLOTS);
    PyModule_AddIntConstant(m, "ABI", 1);
    PyModule_AddObject(m, "SEG_MAGIC", PyLong_FromUnsignedLongLong(SEG_MAGIC));
    return m;
}
