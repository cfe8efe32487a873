/* hs-churn: allocator-overhead benchmark. Each thread frees and re-mallocs random
 * slots of its own ring (70% 8..128 B, 25% 129..1024 B, 5% 1025..8192 B). Ends with nothing live.
 * --mix 1: a check of the counts rather than a benchmark: each op a malloc, a calloc or a
 * realloc of 1 to 20,000 bytes, and the rings stay live at the end; it prints their usable
 * bytes as malloc_usable_size gives them (live_usable=).
 * --ask-size 1: the loop also asks the allocator each block's usable size before its free
 * (malloc_usable_size), as heapsight's hooks must under an allocator other than glibc:
 * bench/overhead's measure of what that one question costs. */
#include <malloc.h>
#include <pthread.h>

#include "scenario.h"

static long nthreads = 1, ops = 5000000, slots = 4096, seed = 1, mix = 0, ask_size = 0;

struct job {
    pthread_t tid;
    long ops; /* this thread's share of --ops */
    uint64_t seed;
    size_t live_usable; /* --mix: what the ring holds at the end */
};

/* inlined in both workers, as it was in the one loop before --ask-size (a call costs 5
 * instructions an op: the churn's counts would move) */
static inline __attribute__((always_inline)) size_t pick_size(uint64_t *s)
{
    unsigned r = (unsigned)(hs_rand(s) % 100);
    if (r < 70)
        return hs_rand_range(s, 8, 128);
    if (r < 95)
        return hs_rand_range(s, 129, 1024);
    return hs_rand_range(s, 1025, 8192);
}

/* A thread's ring of --slots blocks, all empty. */
static char **new_ring(void)
{
    char **ring = calloc(slots, sizeof *ring);
    if (!ring)
        abort();
    return ring;
}

/* The churn's loop; ask (--ask-size, a constant where it is inlined) asks each block's
 * usable size before its free. */
static inline __attribute__((always_inline)) void churn(struct job *j, int ask)
{
    char **ring = new_ring();
    /* The loop's state is local: the jobs sit side by side in one array, and a thread
     * writing its seed there would share a cache line with the other threads' (false
     * sharing that made the 2-thread figures depend on where calloc put the array). */
    uint64_t seed = j->seed;
    const long n = j->ops;
    for (long i = 0; i < n; i++) {
        long k = (long)(hs_rand(&seed) % (uint64_t)slots);
        if (ask && ring[k])
            KEEP(malloc_usable_size(ring[k]));
        free(ring[k]); /* free(NULL) is fine for empty slots */
        ring[k] = malloc(pick_size(&seed));
        if (!ring[k])
            abort();
        ring[k][0] = 1;
        KEEP(ring[k]);
    }
    for (long k = 0; k < slots; k++)
        free(ring[k]);
    free(ring);
}

static void *worker(void *arg) { churn(arg, 0); return NULL; }
static void *worker_ask(void *arg) { churn(arg, 1); return NULL; }

/* --mix: the ring kept, its blocks made by malloc, calloc and realloc */
static void *worker_mix(void *arg)
{
    struct job *j = arg;
    char **ring = new_ring();
    uint64_t seed = j->seed;
    for (long i = 0; i < j->ops; i++) {
        long k = (long)(hs_rand(&seed) % (uint64_t)slots);
        size_t n = hs_rand_range(&seed, 1, 20000);
        switch (hs_rand(&seed) % 3) {
        case 0:
            free(ring[k]);
            ring[k] = malloc(n);
            break;
        case 1:
            free(ring[k]);
            ring[k] = calloc(n % 7 + 1, n / 7 + 1);
            break;
        default: {
            char *q = realloc(ring[k], n);
            if (!q)
                abort();
            ring[k] = q;
        }
        }
        if (!ring[k])
            abort();
        ring[k][0] = 1;
    }
    size_t u = malloc_usable_size(ring);
    for (long k = 0; k < slots; k++)
        u += ring[k] ? malloc_usable_size(ring[k]) : 0;
    j->live_usable = u;
    return NULL;
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"threads", &nthreads, NULL}, {"ops", &ops, NULL},
        {"slots", &slots, NULL},      {"seed", &seed, NULL},
        {"mix", &mix, NULL},          {"ask-size", &ask_size, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (nthreads < 1 || slots < 1) {
        fprintf(stderr, "%s: --threads and --slots must be >= 1\n", argv[0]);
        return 2;
    }

    /* --ops is the total across threads, so ops/seconds is overall throughput. */
    struct job *jobs = calloc(nthreads, sizeof *jobs);
    double t0 = hs_now();
    for (long t = 0; t < nthreads; t++) {
        jobs[t].ops = ops / nthreads + (t < ops % nthreads);
        jobs[t].seed = (uint64_t)seed * 0x9e3779b97f4a7c15ULL + (uint64_t)t + 1;
        if (!jobs[t].seed)
            jobs[t].seed = 1;
        if (pthread_create(&jobs[t].tid, NULL, mix ? worker_mix : ask_size ? worker_ask : worker, &jobs[t]) != 0)
            abort();
    }
    for (long t = 0; t < nthreads; t++)
        pthread_join(jobs[t].tid, NULL);
    double secs = hs_now() - t0;
    size_t live = 0;
    for (long t = 0; t < nthreads; t++)
        live += jobs[t].live_usable;
    free(jobs);
    printf("churn: threads=%ld ops=%ld seconds=%.6f", nthreads, ops, secs);
    if (mix)
        printf(" live_usable=%zu", live);
    printf("\n");
    return 0;
}
