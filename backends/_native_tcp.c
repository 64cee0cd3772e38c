/* hcc.backends._native_tcp — the native core's TCP data plane: runs one rank's compiled
 * programs over the sockets transport's authenticated connections, without the GIL.
 *
 * Terms (see backends/native_tcp.py for the Python side, backends/sockets.py for the wire)
 * - connection: one per peer rank, authenticated in Python (backends/handshake.py), then its
 *   file descriptor is handed here (`add_peer`). Each gets a reader and a writer thread (plain
 *   pthreads: they never touch a Python object). Frames are the sockets transport's, byte for
 *   byte (FRAME "!4sB3x8sIIQ": magic, kind, session, plan, tag, length), so a rank running
 *   this core and one running the Python transport interoperate.
 * - request: a send (queued on its peer's writer) or a receive (posted on its peer, matched
 *   by tag in order). A receive checks the frame's plan id and exact length before a byte
 *   lands; a frame with no receive posted is held in a buffer of its length, bounded first
 *   (the largest message of the plan it names when that plan is running here, else
 *   `max_message`); within a nonzero tag space (bits 24-30) every rank must run one plan, as
 *   in backends/sockets.py ("tag space"). Receives land straight in the caller's memory; a
 *   RecvReduce receives 256 KiB pieces into the connection's scratch and reduces each while
 *   it is in cache (under its run's reduction lock: a plan may leave reductions into one
 *   block unordered).
 * - run: one program (backends/native.py `encode`), its tags ORed with the caller's tag
 *   space. Several runs go at once (one per calling thread: the communicator's lanes); each
 *   waits on its own condition for its completions, so a completion wakes only its run.
 * - failure: EOF or reset without BYE marks the peer dead and a FAIL frame naming it goes to
 *   every other peer once; a FAIL frame received names the rank its sender saw die. A run
 *   fails at once when a peer it has a transfer outstanding with is dead, broken (protocol
 *   error), closed, or reported a death; with no progress for `timeout` seconds it fails
 *   naming its oldest outstanding receive (else send). A failed run leaves nothing of its
 *   own behind: its posted receives and unstarted sends are dropped, and a transfer a
 *   reader or writer is in the middle of ends by shutting that connection down (the
 *   communicator is broken after any failure anyway, hcc/collectives.py).
 *
 * Kept out of backends/_native.c (the shared-memory core): the two share only the kernels,
 * which _native exports as a capsule.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_native_prog.h"

typedef struct {
    int abi;
    void (*combine)(int, int, void *, const void *, const void *, size_t);
    void (*scale)(int, void *, size_t, int64_t);
} hcc_kernels_t;
static hcc_kernels_t *K;

static const int DT_SIZE[8] = {2, 2, 4, 8, 1, 4, 8, 1};
enum { R_SEND, R_RECV, R_RECV_REDUCE };
enum { F_DATA, F_FAIL, F_BYE };
#define FRAME 32
#define PIECE (256 << 10) /* a RecvReduce's piece (backends/sockets.py FOLD_PIECE) */
/* local ops larger than this run with the engine's mutex released (a 16 MiB Copy is ~3 ms
 * during which readers could not match a frame) */
#define UNLOCKED_LOCAL 65536

typedef struct run run_t;

typedef struct treq {
    int kind, peer; /* peer: rank */
    uint32_t tag, plan;
    char *buf;
    const char *fsrc; /* RecvReduce with a fused Copy: dst = fsrc (op) received */
    size_t nbytes;
    int done, posted;
    int64_t id; /* op index in its run, or the Python handle */
    run_t *run; /* NULL: a Python-API request */
    struct treq *next;
} treq_t;

typedef struct held {
    uint32_t tag, plan;
    int peer;
    size_t len;
    char *data;
    int complete;
    treq_t *waiter;
    struct held *next;
} held_t;

typedef struct engine engine_t;

/* the tag-space table (backends/sockets.py "tag space"): per space, the plan its entries
 * belong to, how many there are and the peer of the last one. Within one space every rank
 * runs one plan, so this is O(1) per frame where scanning every list was O(outstanding). */
typedef struct {
    uint32_t plan;
    int peer;
    int64_t n;
} space_t;
#define SPACES 128

typedef struct {
    engine_t *e;
    int rank, fd;
    unsigned char session[8];
    int connected, broken, bye, aborted; /* aborted: 1 + the rank this peer reported dead */
    char err[240];
    treq_t *sq_head, *sq_tail;
    treq_t *posted;
    held_t *held;
    treq_t *wcur, *rcur; /* the request the writer / reader is moving outside the mutex */
    int *ctl;            /* FAIL frames to send (dead ranks) */
    int nctl, want_bye, stop;
    pthread_cond_t wcv;
    pthread_t reader, writer;
    int threads;
    char *scratch;
} tpeer_t;

struct run {
    engine_t *e;
    const int64_t *ops, *dep_ptr, *dep_idx;
    int64_t n_ops, completed;
    int32_t *missing;
    treq_t *reqs;
    int64_t *stack, sp;
    char *bufs[3];
    int op, dt;
    uint32_t plan, shift;
    size_t plan_max;
    int64_t *done, done_len;
    int64_t *pout; /* per peer rank: this run's transfers outstanding */
    pthread_cond_t cv;
    pthread_mutex_t rmu;
    run_t *next;
};

typedef struct {
    treq_t r;
    Py_buffer b;
} preq_t;

struct engine {
    PyObject_HEAD
    int rank, world;
    size_t max_message;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* Python-API waiters */
    tpeer_t *peers;    /* indexed by rank */
    int *gone;         /* per rank: 0 alive, 1 died (seen here), 2 + r: reported by rank r */
    char (*gone_how)[120];
    int *fwd;          /* FAIL frames sent for this rank already */
    run_t *runs;       /* active */
    preq_t **table;
    int64_t table_len, *free_h, nfree;
    space_t posted_sp[SPACES], early_sp[SPACES];
    int closed;
    uint64_t messages, nruns;
};

static void deadline_ts(struct timespec *ts, double secs) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = ts->tv_sec + ts->tv_nsec * 1e-9 + secs;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

static void cond_init(pthread_cond_t *c) {
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

static void timed_wait(pthread_cond_t *c, pthread_mutex_t *mu, double secs) {
    struct timespec ts;
    deadline_ts(&ts, secs);
    pthread_cond_timedwait(c, mu, &ts);
}

/* every waiter looks again (a failure or a close): call with the mutex held */
static void wake_all(engine_t *e) {
    pthread_cond_broadcast(&e->cv);
    for (run_t *R = e->runs; R; R = R->next) pthread_cond_signal(&R->cv);
}

static void complete_req(engine_t *e, treq_t *r) {
    r->done = 1;
    e->messages++;
    if (r->run) {
        run_t *R = r->run;
        R->done[R->done_len++] = r->id;
        R->pout[r->peer]--;
        pthread_cond_signal(&R->cv);
    } else {
        pthread_cond_broadcast(&e->cv);
    }
}

/* a piece of `len` bytes at `off` of receive `r` (RecvReduce under its run's lock) */
static void land(treq_t *r, size_t off, const char *src, size_t len) {
    if (!len) return;
    if (r->kind != R_RECV_REDUCE) {
        memcpy(r->buf + off, src, len);
        return;
    }
    run_t *R = r->run;
    size_t es = DT_SIZE[R->dt];
    pthread_mutex_lock(&R->rmu);
    K->combine(R->op, R->dt, r->buf + off, r->fsrc ? r->fsrc + off : r->buf + off, src, len / es);
    pthread_mutex_unlock(&R->rmu);
}

/* FAIL frames naming `dead` to every other connected peer, once (mutex held) */
static void gossip(engine_t *e, int dead) {
    if (e->fwd[dead]) return;
    e->fwd[dead] = 1;
    for (int q = 0; q < e->world; q++) {
        tpeer_t *p = &e->peers[q];
        if (q == dead || q == e->rank || !p->connected || p->nctl > e->world) continue;
        p->ctl[p->nctl++] = dead;
        pthread_cond_signal(&p->wcv);
    }
}

static void mark_gone(engine_t *e, int rank, int code, const char *how) {
    if (rank < 0 || rank >= e->world || rank == e->rank || e->gone[rank]) return;
    e->gone[rank] = code;
    snprintf(e->gone_how[rank], sizeof e->gone_how[rank], "%s", how);
    gossip(e, rank);
    wake_all(e);
}

static void proto_error(engine_t *e, tpeer_t *p, const char *msg) {
    if (!p->broken) {
        p->broken = 1;
        snprintf(p->err, sizeof p->err, "from rank %d: %s", p->rank, msg);
    }
    shutdown(p->fd, SHUT_RDWR);
    wake_all(e);
}

/* the failure of `peer` that a transfer with it cannot get past: a status (2 died, 3
 * protocol error, 4 closed, 6 it reported a death: *named is that rank) or 0 */
static int failure_of(engine_t *e, int peer, int *named) {
    tpeer_t *p = &e->peers[peer];
    *named = peer;
    if (p->broken) return 3;
    if (e->gone[peer]) return e->gone[peer] == 1 ? 2 : 6;
    if (p->aborted) {
        *named = p->aborted - 1;
        return 6;
    }
    if (p->bye && !p->sq_head && !p->wcur) return 4;
    return 0;
}

static inline uint32_t tag_space(uint32_t tag) { return (tag >> 31) ? 0 : (tag >> 24) & 0x7Fu; }

/* count one receive posted (t = e->posted_sp) or one early frame no receive claims yet (t =
 * e->early_sp) in its tag's space, `by` = +1 / -1 */
static void space_count(space_t *t, uint32_t tag, uint32_t plan, int peer, int by) {
    uint32_t sp = tag_space(tag);
    if (!sp) return;
    if (by > 0) {
        if (!t[sp].n) t[sp].plan = plan;
        t[sp].peer = peer;
    }
    t[sp].n += by;
}

/* the entry of `tag`'s nonzero space when it counts something of a plan other than `plan` */
static space_t *space_other(space_t *t, uint32_t tag, uint32_t plan) {
    uint32_t sp = tag_space(tag);
    return sp && t[sp].n > 0 && t[sp].plan != plan ? &t[sp] : NULL;
}

/* take the posted receive at *pp off its peer's list */
static treq_t *unpost(engine_t *e, treq_t **pp) {
    treq_t *r = *pp;
    *pp = r->next;
    r->next = NULL;
    space_count(e->posted_sp, r->tag, r->plan, r->peer, -1);
    return r;
}

/* a held frame's claim by a receive: claimed (`r`) or given up (NULL) */
static void claim(engine_t *e, held_t *hd, treq_t *r) {
    space_count(e->early_sp, hd->tag, hd->plan, r ? r->peer : hd->peer, r ? -1 : 1);
    hd->waiter = r;
}

/* ------------------------------------------------------------------ posting (mutex held) */
static void post_send(engine_t *e, treq_t *r) {
    tpeer_t *p = &e->peers[r->peer];
    r->next = NULL;
    r->posted = 1;
    if (p->sq_tail)
        p->sq_tail->next = r;
    else
        p->sq_head = r;
    p->sq_tail = r;
    pthread_cond_signal(&p->wcv);
}

static void post_recv(engine_t *e, treq_t *r) {
    tpeer_t *p = &e->peers[r->peer];
    r->next = NULL;
    r->posted = 1;
    space_t *o = space_other(e->early_sp, r->tag, r->plan);
    if (o) {
        tpeer_t *from = &e->peers[o->peer];
        char msg[200];
        snprintf(msg, sizeof msg, "a message of plan %08x arrived in tag space %u, where this rank receives for "
                 "plan %08x: the ranks are running different plans as one call", o->plan, tag_space(r->tag), r->plan);
        proto_error(e, from, msg);
        if (p != from) proto_error(e, p, msg);
        return;
    }
    for (held_t **pp = &p->held; *pp; pp = &(*pp)->next) {
        held_t *hd = *pp;
        if (hd->tag != r->tag || hd->waiter) continue;
        char msg[200];
        if (hd->plan != r->plan) {
            snprintf(msg, sizeof msg, "tag %u was sent for plan %08x, this rank receives it for plan %08x: the "
                     "ranks are running different plans", r->tag, hd->plan, r->plan);
            proto_error(e, p, msg);
            return;
        }
        if (hd->len != r->nbytes) {
            snprintf(msg, sizeof msg, "tag %u has %zu bytes, the receive expects %zu", r->tag, hd->len, r->nbytes);
            proto_error(e, p, msg);
            return;
        }
        claim(e, hd, r);
        if (hd->complete) { /* held frames are early ones: copied under the mutex (one piece) */
            *pp = hd->next;
            land(r, 0, hd->data, hd->len);
            free(hd->data);
            free(hd);
            complete_req(e, r);
        }
        return;
    }
    treq_t **q = &p->posted;
    while (*q) q = &(*q)->next;
    *q = r;
    space_count(e->posted_sp, r->tag, r->plan, r->peer, 1);
}

/* ------------------------------------------------------------------ threads */
static int recv_all(int fd, char *buf, size_t n) {
    while (n) {
        ssize_t k = recv(fd, buf, n, 0);
        if (k == 0) return -1;
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += k;
        n -= (size_t)k;
    }
    return 0;
}

static int send_all(int fd, struct iovec *iov, int n) {
    while (n) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = n;
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        while (n && (size_t)k >= iov->iov_len) {
            k -= iov->iov_len;
            iov++;
            n--;
        }
        if (n) {
            iov->iov_base = (char *)iov->iov_base + k;
            iov->iov_len -= k;
        }
    }
    return 0;
}

static void put_frame(unsigned char *h, int kind, const unsigned char *session, uint32_t plan, uint32_t tag,
                      uint64_t len) {
    memcpy(h, "HCCF", 4);
    h[4] = (unsigned char)kind;
    h[5] = h[6] = h[7] = 0;
    memcpy(h + 8, session, 8);
    for (int i = 0; i < 4; i++) {
        h[16 + i] = (unsigned char)(plan >> (24 - 8 * i));
        h[20 + i] = (unsigned char)(tag >> (24 - 8 * i));
    }
    for (int i = 0; i < 8; i++) h[24 + i] = (unsigned char)(len >> (56 - 8 * i));
}

static void *writer_main(void *arg) {
    tpeer_t *p = arg;
    engine_t *e = p->e;
    unsigned char h[FRAME];
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!p->sq_head && !p->nctl && !p->want_bye && !p->stop) pthread_cond_wait(&p->wcv, &e->mu);
        if (p->stop || p->broken || e->gone[p->rank]) break;
        struct iovec iov[2];
        int n = 1;
        treq_t *r = NULL;
        iov[0].iov_base = h;
        iov[0].iov_len = FRAME;
        if (p->nctl) { /* ahead of queued data, never inside a frame */
            put_frame(h, F_FAIL, p->session, 0, (uint32_t)p->ctl[--p->nctl], 0);
        } else if (p->sq_head) {
            r = p->sq_head;
            p->sq_head = r->next;
            if (!p->sq_head) p->sq_tail = NULL;
            p->wcur = r;
            put_frame(h, F_DATA, p->session, r->plan, r->tag, r->nbytes);
            iov[1].iov_base = r->buf;
            iov[1].iov_len = r->nbytes;
            n = r->nbytes ? 2 : 1;
        } else { /* BYE after every queued send, then half-close */
            put_frame(h, F_BYE, p->session, 0, 0, 0);
            p->want_bye = 0;
            pthread_mutex_unlock(&e->mu);
            send_all(p->fd, iov, 1);
            shutdown(p->fd, SHUT_WR);
            pthread_mutex_lock(&e->mu);
            break;
        }
        pthread_mutex_unlock(&e->mu);
        int bad = send_all(p->fd, iov, n);
        pthread_mutex_lock(&e->mu);
        p->wcur = NULL;
        if (bad) {
            if (!p->stop) {
                char how[120];
                snprintf(how, sizeof how, "send failed: %s", strerror(errno));
                mark_gone(e, p->rank, 1, how);
            }
            wake_all(e);
            break;
        }
        if (r) complete_req(e, r);
    }
    wake_all(e);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static size_t early_bound(engine_t *e, uint32_t plan) {
    for (run_t *R = e->runs; R; R = R->next)
        if (R->plan == plan) return R->plan_max;
    return e->max_message;
}

static void *reader_main(void *arg) {
    tpeer_t *p = arg;
    engine_t *e = p->e;
    unsigned char h[FRAME];
    char msg[240];
    for (;;) {
        if (recv_all(p->fd, (char *)h, FRAME)) goto lost;
        int kind = h[4];
        uint32_t plan = 0, tag = 0;
        uint64_t len = 0;
        for (int i = 0; i < 4; i++) {
            plan = (plan << 8) | h[16 + i];
            tag = (tag << 8) | h[20 + i];
        }
        for (int i = 0; i < 8; i++) len = (len << 8) | h[24 + i];
        pthread_mutex_lock(&e->mu);
        if (memcmp(h, "HCCF", 4) || memcmp(h + 8, p->session, 8)) {
            proto_error(e, p, "bad frame header (magic or session id)");
            goto stop;
        }
        if (kind == F_BYE) {
            p->bye = 1;
            wake_all(e);
            goto stop;
        }
        if (kind == F_FAIL) {
            if (tag >= (uint32_t)e->world) {
                snprintf(msg, sizeof msg, "a FAIL frame names rank %u, outside a world of %d", tag, e->world);
                proto_error(e, p, msg);
                goto stop;
            }
            if ((int)tag != p->rank) {
                snprintf(msg, sizeof msg, "reported by rank %d", p->rank);
                mark_gone(e, (int)tag, 2 + p->rank, msg);
            } else {
                mark_gone(e, (int)tag, 2 + p->rank,
                          "it gave up and announced it (its input was refused, or its run failed)");
            }
            p->aborted = 1 + (int)tag;
            gossip(e, (int)tag);
            wake_all(e);
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        if (kind != F_DATA) {
            snprintf(msg, sizeof msg, "unknown frame kind %d", kind);
            proto_error(e, p, msg);
            goto stop;
        }
        treq_t *r = NULL, **at = &p->posted;
        held_t *hd = NULL;
        space_t *o = NULL;
        msg[0] = 0;
        while (*at && (*at)->tag != tag) at = &(*at)->next;
        r = *at;
        if (r) {
            if (r->plan != plan)
                snprintf(msg, sizeof msg, "message tag %u belongs to plan %08x, the posted receive to plan %08x: "
                         "the ranks are running different plans", tag, plan, r->plan);
            else if (r->nbytes != len)
                snprintf(msg, sizeof msg, "message tag %u has %llu bytes, the posted receive expects %zu", tag,
                         (unsigned long long)len, r->nbytes);
            else
                unpost(e, at);
        } else if ((o = space_other(e->posted_sp, tag, plan))) {
            snprintf(msg, sizeof msg, "message tag %u belongs to plan %08x, this rank runs plan %08x in its tag "
                     "space %u: the ranks are running different plans as one call", tag, plan, o->plan, tag_space(tag));
        } else if (len > early_bound(e, plan)) {
            snprintf(msg, sizeof msg, "frame length %llu exceeds the bound of %zu bytes", (unsigned long long)len,
                     early_bound(e, plan));
        } else {
            hd = calloc(1, sizeof *hd);
            char *data = len ? malloc(len) : NULL;
            if (!hd || (len && !data)) {
                free(hd);
                free(data);
                snprintf(msg, sizeof msg, "out of memory holding an early message of %llu bytes",
                         (unsigned long long)len);
            } else {
                hd->tag = tag;
                hd->plan = plan;
                hd->peer = p->rank;
                hd->len = len;
                hd->data = data;
                space_count(e->early_sp, tag, plan, p->rank, 1);
                held_t **pp = &p->held;
                while (*pp) pp = &(*pp)->next;
                *pp = hd;
            }
        }
        if (msg[0]) {
            proto_error(e, p, msg);
            goto stop;
        }
        p->rcur = r;
        pthread_mutex_unlock(&e->mu);
        int bad = 0;
        if (r && r->kind == R_RECV_REDUCE) {
            for (size_t off = 0; off < len && !bad;) {
                size_t n = len - off < PIECE ? len - off : PIECE;
                bad = recv_all(p->fd, p->scratch, n);
                if (!bad) land(r, off, p->scratch, n);
                off += n;
            }
        } else if (len) {
            bad = recv_all(p->fd, r ? r->buf : hd->data, len);
        }
        pthread_mutex_lock(&e->mu);
        p->rcur = NULL;
        if (bad) {
            pthread_mutex_unlock(&e->mu);
            goto lost;
        }
        if (r) {
            complete_req(e, r);
        } else {
            hd->complete = 1;
            treq_t *w = hd->waiter;
            if (w) { /* its receive was posted while the frame arrived */
                held_t **pp = &p->held;
                while (*pp != hd) pp = &(*pp)->next;
                *pp = hd->next;
                p->rcur = w;
                pthread_mutex_unlock(&e->mu);
                land(w, 0, hd->data, hd->len);
                pthread_mutex_lock(&e->mu);
                p->rcur = NULL;
                free(hd->data);
                free(hd);
                complete_req(e, w);
            }
        }
        pthread_mutex_unlock(&e->mu);
    }
lost:
    pthread_mutex_lock(&e->mu);
    if (!p->stop && !p->bye && !p->broken) {
        snprintf(msg, sizeof msg, "connection lost: %s", errno ? strerror(errno) : "closed");
        mark_gone(e, p->rank, 1, msg);
    }
stop:
    p->rcur = NULL;
    wake_all(e);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ------------------------------------------------------------------ the Engine type */
static void engine_free(engine_t *e) {
    if (e->peers) {
        for (int q = 0; q < e->world; q++) {
            tpeer_t *p = &e->peers[q];
            for (held_t *h = p->held, *nx; h; h = nx) {
                nx = h->next;
                free(h->data);
                free(h);
            }
            if (p->fd >= 0) close(p->fd);
            free(p->ctl);
            free(p->scratch);
            pthread_cond_destroy(&p->wcv);
        }
        free(e->peers);
        e->peers = NULL;
    }
    if (e->table) {
        for (int64_t i = 0; i < e->table_len; i++)
            if (e->table[i]) {
                PyBuffer_Release(&e->table[i]->b);
                free(e->table[i]);
            }
        free(e->table);
        e->table = NULL;
        free(e->free_h);
        e->free_h = NULL;
    }
    free(e->gone);
    free(e->gone_how);
    free(e->fwd);
    e->gone = NULL;
    e->gone_how = NULL;
    e->fwd = NULL;
}

static int engine_busy_threads(engine_t *e) {
    for (int q = 0; e->peers && q < e->world; q++)
        if (e->peers[q].threads) return 1;
    return 0;
}

static void Engine_dealloc(engine_t *e) {
    if (!engine_busy_threads(e)) { /* else the threads still read it: leak (only at exit) */
        engine_free(e);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    PyTypeObject *type = Py_TYPE(e);
    type->tp_free((PyObject *)e);
    Py_DECREF(type);
}

/* Engine(rank, world, max_message) */
static int Engine_init(engine_t *e, PyObject *args, PyObject *kw) {
    int rank, world;
    Py_ssize_t max_message;
    if (!PyArg_ParseTuple(args, "iin", &rank, &world, &max_message)) return -1;
    if (e->peers || world < 1 || rank < 0 || rank >= world || max_message < 0) {
        PyErr_SetString(PyExc_ValueError, "Engine(rank, world, max_message): bad arguments or initialised");
        return -1;
    }
    pthread_mutex_init(&e->mu, NULL);
    cond_init(&e->cv);
    e->rank = rank;
    e->world = world;
    e->max_message = (size_t)max_message;
    e->peers = calloc(world, sizeof(tpeer_t));
    e->gone = calloc(world, sizeof(int));
    e->gone_how = calloc(world, sizeof *e->gone_how);
    e->fwd = calloc(world, sizeof(int));
    if (!e->peers || !e->gone || !e->gone_how || !e->fwd) {
        PyErr_NoMemory();
        return -1;
    }
    for (int q = 0; q < world; q++) {
        tpeer_t *p = &e->peers[q];
        p->e = e;
        p->rank = q;
        p->fd = -1;
        cond_init(&p->wcv);
        p->ctl = calloc(world + 2, sizeof(int));
        if (!p->ctl) {
            PyErr_NoMemory();
            return -1;
        }
    }
    return 0;
}

/* add_peer(rank, fd, session): take over an authenticated connection (the fd is ours now) */
static PyObject *Engine_add_peer(engine_t *e, PyObject *args) {
    int rank, fd;
    Py_buffer s;
    if (!PyArg_ParseTuple(args, "iiy*", &rank, &fd, &s)) return NULL;
    PyObject *res = NULL;
    tpeer_t *p = rank >= 0 && rank < e->world && rank != e->rank ? &e->peers[rank] : NULL;
    if (!p || p->fd >= 0 || s.len != 8 || e->closed) {
        PyErr_SetString(PyExc_ValueError, "add_peer: no such peer, already connected, or a bad session id");
        goto out;
    }
    p->scratch = malloc(PIECE);
    if (!p->scratch) {
        PyErr_NoMemory();
        goto out;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    memcpy(p->session, s.buf, 8);
    pthread_mutex_lock(&e->mu);
    p->fd = fd;
    p->connected = 1;
    if (pthread_create(&p->reader, NULL, reader_main, p) == 0) {
        if (pthread_create(&p->writer, NULL, writer_main, p) == 0) {
            p->threads = 2;
        } else {
            p->stop = 1;
            shutdown(fd, SHUT_RDWR);
            p->threads = 1;
        }
    }
    if (e->gone[rank] == 0)
        for (int d = 0; d < e->world; d++) /* deaths known before it connected */
            if (e->fwd[d] && d != rank && p->nctl <= e->world) p->ctl[p->nctl++] = d;
    pthread_cond_signal(&p->wcv);
    pthread_mutex_unlock(&e->mu);
    if (p->threads != 2) {
        PyErr_SetString(PyExc_OSError, "add_peer: cannot start the connection's threads");
        goto out;
    }
    res = Py_None;
    Py_INCREF(res);
out:
    PyBuffer_Release(&s);
    return res;
}

/* a handle for `r`: a released one (a stack of them, O(1)), else the table grows by half */
static int64_t table_put(engine_t *e, preq_t *r) {
    if (!e->nfree) {
        int64_t grown = e->table_len + e->table_len / 2 + 16;
        preq_t **t = realloc(e->table, grown * sizeof(preq_t *));
        int64_t *f = realloc(e->free_h, grown * sizeof(int64_t));
        if (t) e->table = t;
        if (f) e->free_h = f;
        if (!t || !f) return -1;
        for (int64_t h = grown - 1; h >= e->table_len; h--) {
            e->table[h] = NULL;
            e->free_h[e->nfree++] = h;
        }
        e->table_len = grown;
    }
    int64_t h = e->free_h[--e->nfree];
    e->table[h] = r;
    return h;
}

/* isend/irecv(peer, tag, plan, buffer) -> handle; the engine holds the buffer until release */
static PyObject *post_request(engine_t *e, PyObject *args, int kind) {
    int peer;
    unsigned int tag, plan;
    preq_t *pr = calloc(1, sizeof *pr);
    if (!pr) return PyErr_NoMemory();
    if (!PyArg_ParseTuple(args, kind == R_SEND ? "iIIy*" : "iIIw*", &peer, &tag, &plan, &pr->b)) {
        free(pr);
        return NULL;
    }
    if (peer < 0 || peer >= e->world || peer == e->rank || e->closed || !e->peers) {
        PyBuffer_Release(&pr->b);
        free(pr);
        PyErr_SetString(PyExc_ValueError, "no such peer, or the engine is closed");
        return NULL;
    }
    treq_t *r = &pr->r;
    r->kind = kind;
    r->peer = peer;
    r->tag = tag;
    r->plan = plan;
    r->buf = pr->b.buf;
    r->nbytes = (size_t)pr->b.len;
    pthread_mutex_lock(&e->mu);
    int64_t h = table_put(e, pr);
    if (h >= 0) {
        r->id = h;
        if (kind == R_SEND)
            post_send(e, r);
        else
            post_recv(e, r);
    }
    pthread_mutex_unlock(&e->mu);
    if (h < 0) {
        PyBuffer_Release(&pr->b);
        free(pr);
        return PyErr_NoMemory();
    }
    return PyLong_FromLongLong(h);
}

static PyObject *Engine_isend(engine_t *e, PyObject *args) { return post_request(e, args, R_SEND); }
static PyObject *Engine_irecv(engine_t *e, PyObject *args) { return post_request(e, args, R_RECV); }

static preq_t *handle_req(engine_t *e, long long h) {
    return h >= 0 && h < e->table_len && e->table ? e->table[h] : NULL;
}

static PyObject *status_tuple(engine_t *e, int status, int peer) {
    const char *msg = "";
    if (status == 3 && peer >= 0 && peer < e->world) msg = e->peers[peer].err;
    if ((status == 2 || status == 6) && peer >= 0 && peer < e->world) msg = e->gone_how[peer];
    return Py_BuildValue("(iis)", status, peer, msg);
}

/* wait(handles, timeout) -> (done handles, status, peer, message): status 0 some done, 1
 * timeout, 2/3/4/6 as failure_of for a handle's peer (GIL released) */
static PyObject *Engine_wait(engine_t *e, PyObject *args) {
    PyObject *lst;
    double timeout;
    if (!PyArg_ParseTuple(args, "Od", &lst, &timeout)) return NULL;
    PyObject *seq = PySequence_Fast(lst, "handles must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    long long *hs = malloc((n ? n : 1) * sizeof(long long));
    if (!hs) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) hs[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred()) {
        free(hs);
        return NULL;
    }
    int status = 1, fpeer = -1;
    char *done = calloc(n ? n : 1, 1);
    Py_BEGIN_ALLOW_THREADS
    double end = prog_now_s() + timeout;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        int any = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            preq_t *pr = handle_req(e, hs[i]);
            if (!pr || pr->r.done) done[i] = any = 1;
        }
        if (any) {
            status = 0;
            break;
        }
        int st = 0;
        for (int pass = 0; pass < 2 && !st; pass++) /* a protocol error first, as in run() */
            for (Py_ssize_t i = 0; i < n && !st; i++) {
                int peer = handle_req(e, hs[i])->r.peer;
                if (pass || e->peers[peer].broken) st = failure_of(e, peer, &fpeer);
            }
        if (st) {
            status = st;
            break;
        }
        double left = end - prog_now_s();
        if (left <= 0 || e->closed) break;
        timed_wait(&e->cv, &e->mu, left < 0.5 ? left : 0.5);
    }
    pthread_mutex_unlock(&e->mu);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(0);
    for (Py_ssize_t i = 0; out && i < n; i++)
        if (done[i]) {
            PyObject *v = PyLong_FromLongLong(hs[i]);
            PyList_Append(out, v);
            Py_XDECREF(v);
        }
    free(hs);
    free(done);
    if (!out) return NULL;
    PyObject *st = status_tuple(e, status, fpeer);
    PyObject *res = Py_BuildValue("(NN)", out, st);
    return res;
}

static PyObject *Engine_done(engine_t *e, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    pthread_mutex_lock(&e->mu);
    preq_t *pr = handle_req(e, h);
    int d = !pr || pr->r.done;
    pthread_mutex_unlock(&e->mu);
    return PyBool_FromLong(d);
}

/* release(handle): forget a request (done, or its peer failed: it is taken off its queue) */
static PyObject *Engine_release(engine_t *e, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    preq_t *pr = NULL;
    int busy = 0;
    pthread_mutex_lock(&e->mu);
    pr = handle_req(e, h);
    if (pr && !pr->r.done) {
        tpeer_t *p = &e->peers[pr->r.peer];
        busy = p->wcur == &pr->r || p->rcur == &pr->r;
        for (held_t *hd = p->held; hd; hd = hd->next)
            if (hd->waiter == &pr->r) claim(e, hd, NULL);
        for (treq_t **pp = &p->posted; *pp; pp = &(*pp)->next)
            if (*pp == &pr->r) {
                unpost(e, pp);
                break;
            }
        treq_t *prev = NULL;
        for (treq_t *q = p->sq_head; q; prev = q, q = q->next)
            if (q == &pr->r) {
                if (prev)
                    prev->next = q->next;
                else
                    p->sq_head = q->next;
                if (p->sq_tail == q) p->sq_tail = prev;
                break;
            }
        if (busy) shutdown(p->fd, SHUT_RDWR); /* the thread moving it stops at once */
    }
    if (pr && !busy) {
        e->table[h] = NULL;
        e->free_h[e->nfree++] = h;
    }
    pthread_mutex_unlock(&e->mu);
    if (pr && !busy) {
        PyBuffer_Release(&pr->b);
        free(pr);
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ the program runner */
/* run op k and, depth first, every local op it releases; transfers are posted (mutex held;
 * released around large local ops) */
static void run_from(run_t *R, int64_t k0) {
    for (R->stack[R->sp++] = k0; R->sp > 0;) {
        int64_t k = R->stack[--R->sp];
        const int64_t *f = R->ops + k * NF;
        int kind = (int)f[0];
        engine_t *e = R->e;
        if (kind <= K_RECV_REDUCE) {
            treq_t *r = &R->reqs[k];
            r->kind = kind == K_SEND ? R_SEND : kind == K_RECV ? R_RECV : R_RECV_REDUCE;
            r->peer = (int)f[1];
            r->tag = (uint32_t)f[2] | R->shift;
            r->plan = R->plan;
            r->buf = R->bufs[f[3]] + f[4];
            r->nbytes = (size_t)f[5];
            r->fsrc = f[6] >= 0 ? R->bufs[f[6]] + f[7] : NULL;
            r->id = k;
            r->run = R;
            R->pout[r->peer]++;
            if (kind == K_SEND)
                post_send(e, r);
            else
                post_recv(e, r);
            continue;
        }
        int unlock = (size_t)f[5] > UNLOCKED_LOCAL && kind != K_NOP;
        if (unlock) pthread_mutex_unlock(&e->mu);
        prog_local(f, R->bufs, R->op, R->dt, DT_SIZE[R->dt], K->combine, K->scale, &R->rmu);
        if (unlock) pthread_mutex_lock(&e->mu);
        R->completed++;
        for (int64_t j = R->dep_ptr[k]; j < R->dep_ptr[k + 1]; j++) {
            int64_t d = R->dep_idx[j];
            if (--R->missing[d] == 0) R->stack[R->sp++] = d;
        }
    }
}

/* a run that stops early leaves nothing of its own behind (mutex held; see the top) */
static void abandon(run_t *R) {
    engine_t *e = R->e;
    treq_t *lo = R->reqs, *hi = R->reqs + R->n_ops;
#define MINE(r) ((r) >= lo && (r) < hi)
    for (int q = 0; q < e->world; q++) {
        tpeer_t *p = &e->peers[q];
        for (treq_t **pp = &p->posted; *pp;)
            if (MINE(*pp))
                unpost(e, pp);
            else
                pp = &(*pp)->next;
        for (held_t *h = p->held; h; h = h->next)
            if (MINE(h->waiter)) claim(e, h, NULL);
        p->sq_tail = NULL; /* its sends not yet started are dropped (one being written is below) */
        for (treq_t **pp = &p->sq_head; *pp;) {
            if (MINE(*pp)) {
                *pp = (*pp)->next;
                continue;
            }
            p->sq_tail = *pp;
            pp = &(*pp)->next;
        }
    }
    for (int round = 0; round < 500; round++) { /* bounded: 5 s */
        int busy = 0;
        for (int q = 0; q < e->world; q++) {
            tpeer_t *p = &e->peers[q];
            if ((p->wcur && MINE(p->wcur)) || (p->rcur && MINE(p->rcur))) {
                busy = 1;
                shutdown(p->fd, SHUT_RDWR);
            }
        }
        if (!busy) return;
        timed_wait(&R->cv, &e->mu, 0.01);
    }
#undef MINE
}

/* run(ops, dep_ptr, dep_idx, missing, first, in, out, tmp, op, dtype, plan, shift, plan_max,
 *     timeout) -> (status, op index, peer rank, message): status 0 done, 1 no progress for
 * `timeout` s (op: the oldest outstanding receive, else send), 2 the peer died, 3 protocol
 * error, 4 the peer closed, 6 a peer reported that the rank named died. Ops' peers are ranks;
 * `shift` is ORed into every tag. GIL released for the whole run; runs on several threads at
 * once share the connections. */
static PyObject *Engine_run(engine_t *e, PyObject *args) {
    /* the program's arrays, then in (read), out and tmp (written; None: absent) */
    Py_buffer arr[5], buf[3];
    PyObject *obj[3];
    int op, dt, nbuf = 0;
    unsigned int plan, shift;
    Py_ssize_t plan_max;
    double timeout;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*OOOiiIInd", &arr[0], &arr[1], &arr[2], &arr[3], &arr[4], &obj[0],
                          &obj[1], &obj[2], &op, &dt, &plan, &shift, &plan_max, &timeout))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t sizes[3] = {0, 0, 0};
    char *bufs[3] = {NULL, NULL, NULL};
    int ro_in = 0;
    if (e->closed || !e->peers || op < 0 || op > 3 || dt < 0 || dt > 7) {
        PyErr_SetString(PyExc_ValueError, "engine closed, or an unknown op or dtype code");
        goto out;
    }
    for (; nbuf < 3; nbuf++) {
        buf[nbuf].obj = NULL;
        if (obj[nbuf] == Py_None) continue;
        if (PyObject_GetBuffer(obj[nbuf], &buf[nbuf], nbuf ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) goto out;
        sizes[nbuf] = buf[nbuf].len;
        bufs[nbuf] = buf[nbuf].buf;
    }
    ro_in = buf[0].obj && buf[0].readonly;
    const int64_t *O = arr[0].buf, *DP = arr[1].buf;
    int64_t n_ops = arr[0].len / (int64_t)(NF * sizeof(int64_t));
    if (arr[0].len != n_ops * (Py_ssize_t)(NF * sizeof(int64_t)) || arr[1].len != (n_ops + 1) * 8 ||
        arr[3].len != n_ops * 4 || arr[2].len % 8 ||
        prog_check(O, n_ops, sizes, ro_in, DT_SIZE[dt], DP, arr[2].buf, arr[2].len / 8, arr[4].buf, arr[4].len / 8))
        goto bad;
    for (int64_t k = 0; k < n_ops; k++) { /* every transfer's peer a rank, its tag in 32 bits */
        const int64_t *f = O + k * NF;
        if (f[0] <= K_RECV_REDUCE && (f[1] < 0 || f[1] >= e->world || f[1] == e->rank || (f[2] | shift) > 0xFFFFFFFFLL))
            goto bad;
    }
    {
        run_t R;
        memset(&R, 0, sizeof R);
        R.e = e;
        R.ops = O;
        R.dep_ptr = DP;
        R.dep_idx = arr[2].buf;
        R.n_ops = n_ops;
        R.op = op;
        R.dt = dt;
        R.plan = plan;
        R.shift = shift;
        R.plan_max = (size_t)plan_max;
        memcpy(R.bufs, bufs, sizeof bufs);
        R.missing = malloc((n_ops ? n_ops : 1) * sizeof(int32_t));
        R.reqs = calloc(n_ops ? n_ops : 1, sizeof(treq_t));
        R.stack = malloc((n_ops + 1) * sizeof(int64_t));
        R.done = malloc((n_ops + 1) * sizeof(int64_t));
        R.pout = calloc(e->world, sizeof(int64_t));
        if (!R.missing || !R.reqs || !R.stack || !R.done || !R.pout) {
            free(R.missing);
            free(R.reqs);
            free(R.stack);
            free(R.done);
            free(R.pout);
            PyErr_NoMemory();
            goto out;
        }
        memcpy(R.missing, arr[3].buf, n_ops * sizeof(int32_t));
        for (int64_t k = 0; k < n_ops; k++) R.reqs[k].id = -1; /* not posted */
        cond_init(&R.cv);
        pthread_mutex_init(&R.rmu, NULL);
        int64_t nfirst = arr[4].len / 8;
        const int64_t *F = arr[4].buf;
        int status = 0, fpeer = -1;
        int64_t fop = -1;
        int64_t *batch = malloc((n_ops + 1) * sizeof(int64_t));
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&e->mu);
        R.next = e->runs;
        e->runs = &R;
        for (int64_t i = 0; i < nfirst; i++)
            if (R.missing[F[i]] == 0) run_from(&R, F[i]);
        double last = prog_now_s();
        while (batch) {
            if (R.done_len) {
                int64_t nb = R.done_len;
                memcpy(batch, R.done, nb * sizeof(int64_t));
                R.done_len = 0;
                for (int64_t i = 0; i < nb; i++) {
                    int64_t k = batch[i];
                    R.completed++;
                    for (int64_t j = DP[k]; j < DP[k + 1]; j++) {
                        int64_t d = R.dep_idx[j];
                        if (--R.missing[d] == 0) run_from(&R, d);
                    }
                }
                last = prog_now_s();
                continue; /* run_from may have let the mutex go: completions may be waiting */
            }
            if (R.completed >= n_ops) break;
            /* a protocol error first: it says why the peers stopped, their deaths do not */
            for (int q = 0; q < e->world && !status; q++)
                if (R.pout[q] > 0 && e->peers[q].broken) status = failure_of(e, q, &fpeer);
            for (int q = 0; q < e->world && !status; q++)
                if (R.pout[q] > 0) status = failure_of(e, q, &fpeer);
            if (status || e->closed) {
                if (!status) status = 4;
                break;
            }
            double left = last + timeout - prog_now_s();
            if (left <= 0) {
                status = 1;
                break;
            }
            timed_wait(&R.cv, &e->mu, left < 1.0 ? left : 1.0);
        }
        if (!batch) status = 5;
        if (status) {
            /* blame: the op waiting on the failed peer, else the oldest outstanding receive,
             * else send */
            int64_t best_recv = -1, best_send = -1, on_peer = -1;
            for (int64_t k = 0; k < n_ops; k++) {
                int kind = (int)O[k * NF];
                if (kind > K_RECV_REDUCE || R.reqs[k].id != k || R.reqs[k].done) continue;
                if (on_peer < 0 && status != 1 && O[k * NF + 1] == fpeer) on_peer = k;
                if (kind == K_SEND) {
                    if (best_send < 0) best_send = k;
                } else if (best_recv < 0) {
                    best_recv = k;
                }
            }
            fop = on_peer >= 0 ? on_peer : best_recv >= 0 ? best_recv : best_send;
            if (status == 1 && fop >= 0) fpeer = (int)O[fop * NF + 1];
            abandon(&R);
        }
        for (run_t **pp = &e->runs; *pp; pp = &(*pp)->next)
            if (*pp == &R) {
                *pp = R.next;
                break;
            }
        if (!status) e->nruns++;
        pthread_mutex_unlock(&e->mu);
        Py_END_ALLOW_THREADS
        free(batch);
        free(R.missing);
        free(R.reqs);
        free(R.stack);
        free(R.done);
        free(R.pout);
        pthread_cond_destroy(&R.cv);
        pthread_mutex_destroy(&R.rmu);
        if (status == 5) {
            PyErr_NoMemory();
        } else {
            PyObject *st = status_tuple(e, status, fpeer);
            if (st) {
                result = Py_BuildValue("(iLis)", status, (long long)fop, fpeer, PyUnicode_AsUTF8(PyTuple_GET_ITEM(st, 2)));
                Py_DECREF(st);
            }
        }
    }
    goto out;
bad:
    PyErr_SetString(PyExc_ValueError, "program outside its buffers or peers (encode() and the buffers disagree)");
out:
    for (int i = 0; i < 5; i++) PyBuffer_Release(&arr[i]);
    for (int i = 0; i < nbuf && i < 3; i++)
        if (buf[i].obj) PyBuffer_Release(&buf[i]);
    return result;
}

/* ------------------------------------------------------------------ failures and closing */
/* dead() -> {rank: (how, reported by rank or -1)} */
static PyObject *Engine_dead(engine_t *e, PyObject *noargs) {
    PyObject *d = PyDict_New();
    if (!d || !e->gone) return d;
    pthread_mutex_lock(&e->mu);
    for (int q = 0; q < e->world; q++)
        if (e->gone[q]) {
            PyObject *v = Py_BuildValue("(si)", e->gone_how[q], e->gone[q] == 1 ? -1 : e->gone[q] - 2);
            PyObject *k = PyLong_FromLong(q);
            if (v && k) PyDict_SetItem(d, k, v);
            Py_XDECREF(v);
            Py_XDECREF(k);
        }
    pthread_mutex_unlock(&e->mu);
    return d;
}

/* failure(peer) -> (status, named rank, message): what a transfer with `peer` cannot get past */
static PyObject *Engine_failure(engine_t *e, PyObject *args) {
    int peer, named = -1, st = 0;
    if (!PyArg_ParseTuple(args, "i", &peer)) return NULL;
    if (peer < 0 || peer >= e->world || !e->peers) return Py_BuildValue("(iis)", 0, -1, "");
    pthread_mutex_lock(&e->mu);
    st = failure_of(e, peer, &named);
    pthread_mutex_unlock(&e->mu);
    return status_tuple(e, st, st == 3 ? peer : named);
}

/* set_failed(rank, how): `rank` died (learnt in Python: the launcher, a give-up); tell the
 * peers. set_failed(own rank, ""): this rank gives up (FAIL frames naming it) */
static PyObject *Engine_set_failed(engine_t *e, PyObject *args) {
    int rank;
    const char *how;
    if (!PyArg_ParseTuple(args, "is", &rank, &how)) return NULL;
    if (rank < 0 || rank >= e->world || !e->peers) Py_RETURN_NONE;
    pthread_mutex_lock(&e->mu);
    if (rank == e->rank)
        gossip(e, rank);
    else
        mark_gone(e, rank, 1, how);
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

static PyObject *Engine_interrupt(engine_t *e, PyObject *noargs) {
    pthread_mutex_lock(&e->mu);
    wake_all(e);
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

/* close(timeout): BYE after every queued send on each connection, wait (bounded) for the
 * peers' BYE, then stop the threads and close the sockets */
static PyObject *Engine_close(engine_t *e, PyObject *args) {
    double timeout;
    if (!PyArg_ParseTuple(args, "d", &timeout)) return NULL;
    if (e->closed || !e->peers) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&e->mu);
    for (int q = 0; q < e->world; q++) {
        tpeer_t *p = &e->peers[q];
        if (p->connected) {
            p->want_bye = 1;
            pthread_cond_signal(&p->wcv);
        }
    }
    double end = prog_now_s() + timeout;
    for (;;) { /* our BYEs out, the peers' in (their readers end) */
        int busy = 0;
        for (int q = 0; q < e->world; q++) {
            tpeer_t *p = &e->peers[q];
            if (p->connected && !p->broken && !e->gone[q] && (!p->bye || p->want_bye)) busy = 1;
        }
        if (!busy || prog_now_s() >= end) break;
        timed_wait(&e->cv, &e->mu, 0.05);
    }
    e->closed = 1;
    for (int q = 0; q < e->world; q++) {
        tpeer_t *p = &e->peers[q];
        p->stop = 1;
        pthread_cond_signal(&p->wcv);
        if (p->fd >= 0) shutdown(p->fd, SHUT_RDWR);
    }
    wake_all(e);
    pthread_mutex_unlock(&e->mu);
    for (int q = 0; q < e->world; q++) {
        tpeer_t *p = &e->peers[q];
        if (p->threads) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 5;
            int a = pthread_timedjoin_np(p->reader, NULL, &ts);
            int b = pthread_timedjoin_np(p->writer, NULL, &ts);
            if (a == 0 && b == 0) p->threads = 0;
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Engine_stats(engine_t *e, PyObject *noargs) {
    int64_t held = 0;
    pthread_mutex_lock(&e->mu);
    for (int q = 0; e->peers && q < e->world; q++)
        for (held_t *h = e->peers[q].held; h; h = h->next) held++;
    pthread_mutex_unlock(&e->mu);
    return Py_BuildValue("{s:K,s:K,s:L}", "messages", (unsigned long long)e->messages, "runs",
                         (unsigned long long)e->nruns, "held", (long long)held);
}

static PyObject *Engine_set_max_message(engine_t *e, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    pthread_mutex_lock(&e->mu);
    if (n >= 0) e->max_message = (size_t)n;
    pthread_mutex_unlock(&e->mu);
    Py_RETURN_NONE;
}

static PyObject *Engine_connected(engine_t *e, PyObject *noargs) {
    int n = 0;
    for (int q = 0; e->peers && q < e->world; q++) n += e->peers[q].connected;
    return PyLong_FromLong(n);
}

/* the methods, one line each: M(name, flags, doc) is {"name", Engine_name, flags, doc} */
#define M(name, flags, doc) {#name, (PyCFunction)Engine_##name, flags, doc}
static PyMethodDef Engine_methods[] = {
    M(add_peer, METH_VARARGS, "add_peer(rank, fd, session): take over a connection"),
    M(set_max_message, METH_VARARGS, "the bound of an early frame"),
    M(connected, METH_NOARGS, "how many peers are connected"),
    M(isend, METH_VARARGS, "isend(peer, tag, plan, buffer) -> handle"),
    M(irecv, METH_VARARGS, "irecv(peer, tag, plan, buffer) -> handle"),
    M(wait, METH_VARARGS, "wait(handles, timeout) -> (done, (status, peer, message))"),
    M(done, METH_VARARGS, "done(handle) -> bool"),
    M(release, METH_VARARGS, "release(handle): forget a request"),
    M(run, METH_VARARGS, "run one rank's encoded program (GIL released)"),
    M(dead, METH_NOARGS, "{rank: (how, reported by or -1)}"),
    M(failure, METH_VARARGS, "failure(peer) -> (status, rank, message)"),
    M(set_failed, METH_VARARGS, "set_failed(rank, how)"),
    M(interrupt, METH_NOARGS, "wake every waiter"),
    M(close, METH_VARARGS, "close(timeout)"),
    M(stats, METH_NOARGS, "counters"),
    {NULL, NULL, 0, NULL},
};
#undef M

/* a heap type (PyType_FromSpec): its instances hold a reference to it */
static PyType_Slot engine_slots[] = {
    {Py_tp_new, PyType_GenericNew}, {Py_tp_init, Engine_init},   {Py_tp_dealloc, Engine_dealloc},
    {Py_tp_methods, Engine_methods}, {Py_tp_doc, (void *)"TCP connections of one rank and the runner of its programs "
                                                "(backends/native_tcp.py)"},
    {0, NULL},
};
static PyType_Spec engine_spec = {"hcc.backends._native_tcp.Engine", sizeof(engine_t), 0, Py_TPFLAGS_DEFAULT,
                                  engine_slots};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "hcc.backends._native_tcp",
                                       "The native core's TCP data plane (see backends/native_tcp.py).", -1, NULL};

PyMODINIT_FUNC PyInit__native_tcp(void) {
    PyObject *core = PyImport_ImportModule("hcc.backends._native"); /* sets hcc.backends._native */
    if (!core) return NULL;
    Py_DECREF(core);
    K = PyCapsule_Import("hcc.backends._native._kernels", 0);
    if (!K) return NULL;
    if (K->abi != 1) {
        PyErr_SetString(PyExc_ImportError, "hcc.backends._native has another kernel ABI");
        return NULL;
    }
    PyObject *m = PyModule_Create(&moduledef);
    PyObject *type = m ? PyType_FromSpec(&engine_spec) : NULL;
    if (!type || PyModule_AddObject(m, "Engine", type) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
