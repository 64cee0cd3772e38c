/* The op table both native cores run — backends/_native.c (shared-memory channels) and
 * backends/_native_tcp.c (TCP connections) — and what they share about it: its layout
 * (backends/native.py encode()), its checks against the caller's buffers, and the local ops.
 *
 * An op is NF int64 fields (kind, peer, tag, dst buffer, dst byte offset, bytes, src buffer,
 * src byte offset, divisor, external); buffers are numbered in 0, out 1, tmp 2. Peers are each
 * core's own business (a local index on the channels, a rank over TCP), so prog_check leaves
 * them to the caller. Include after Python.h and pthread.h.
 */
#ifndef HCC_NATIVE_PROG_H
#define HCC_NATIVE_PROG_H

enum { K_SEND, K_RECV, K_RECV_REDUCE, K_COPY, K_REDUCE, K_SCALE, K_NOP };
#define NF 10 /* fields per op */

typedef void (*prog_combine_fn)(int op, int dt, void *dst, const void *a, const void *b, size_t n);
typedef void (*prog_scale_fn)(int dt, void *dst, size_t n, int64_t divisor);

/* 0 when every op's byte ranges lie inside the buffers (`sizes`: in, out, tmp; in read-only
 * when `ro_in`), every reduction covers whole elements of `elem` bytes, every Scale divides by
 * a positive number, and the dependency lists (dep_ptr, dep_idx of `n_idx` entries) and the
 * start list (`first`, `n_first`) name ops of the table; else -1 */
static int prog_check(const int64_t *ops, int64_t n_ops, const Py_ssize_t sizes[3], int ro_in, int elem,
                      const int64_t *dep_ptr, const int64_t *dep_idx, int64_t n_idx, const int64_t *first,
                      int64_t n_first) {
    for (int64_t k = 0; k < n_ops; k++) {
        const int64_t *f = ops + k * NF;
        int kind = (int)f[0];
        if (kind < 0 || kind > K_NOP || f[5] < 0) return -1;
        if (kind == K_NOP) continue;
        if (f[3] < 0 || f[3] > 2 || f[4] < 0 || f[4] + f[5] > sizes[f[3]]) return -1;
        if (kind != K_SEND && f[3] == 0 && ro_in) return -1;
        if ((kind == K_COPY || kind == K_REDUCE || (kind == K_RECV_REDUCE && f[6] >= 0)) &&
            (f[6] < 0 || f[6] > 2 || f[7] < 0 || f[7] + f[5] > sizes[f[6]]))
            return -1;
        if ((kind == K_RECV_REDUCE || kind == K_REDUCE || kind == K_SCALE) && f[5] % elem) return -1;
        if (kind == K_SCALE && f[8] <= 0) return -1;
    }
    if (dep_ptr[0] != 0 || dep_ptr[n_ops] != n_idx) return -1;
    for (int64_t k = 0; k < n_ops; k++)
        if (dep_ptr[k + 1] < dep_ptr[k]) return -1;
    for (int64_t j = 0; j < n_idx; j++)
        if (dep_idx[j] < 0 || dep_idx[j] >= n_ops) return -1;
    for (int64_t j = 0; j < n_first; j++)
        if (first[j] < 0 || first[j] >= n_ops) return -1;
    return 0;
}

/* run local op `f` (Copy, Reduce, Scale; a NOP does nothing) on `bufs`; a Reduce holds
 * `reduce_lock` when one is given (a core whose receives reduce in other threads) */
static inline void prog_local(const int64_t *f, char *const bufs[3], int op, int dt, int elem,
                              prog_combine_fn combine_, prog_scale_fn scale_, pthread_mutex_t *reduce_lock) {
    int kind = (int)f[0];
    if (kind == K_NOP) return;
    size_t nb = (size_t)f[5];
    char *d = bufs[f[3]] + f[4];
    if (kind == K_COPY) {
        const char *s = bufs[f[6]] + f[7];
        if (d != s && nb) memmove(d, s, nb);
    } else if (kind == K_REDUCE) {
        if (reduce_lock) pthread_mutex_lock(reduce_lock);
        combine_(op, dt, d, d, bufs[f[6]] + f[7], nb / elem);
        if (reduce_lock) pthread_mutex_unlock(reduce_lock);
    } else if (kind == K_SCALE && f[8] != 1) {
        scale_(dt, d, nb / elem, f[8]);
    }
}

static inline double prog_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
