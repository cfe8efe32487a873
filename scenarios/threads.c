/* hs-threads: many threads start together (arena contention), churn, then each keeps
 * keep_kb KiB in 1 KiB blocks. Truth: kept_bytes = threads*keep_kb*1024 live at exit.
 * With --free-kept 1 every thread holds its blocks until all hold theirs, then frees them:
 * kept_bytes is then the peak (all threads alive and holding at once) and nothing is live
 * at exit. */
#include <pthread.h>

#include "scenario.h"

static long nthreads = 64, rounds = 200, keep_kb = 256, free_kept = 0;
static pthread_barrier_t start, holding;

static void *worker(void *arg)
{
    uint64_t seed = 0x2545f4914f6cdd1dULL + (uintptr_t)arg; /* per-thread, fixed */
    void *batch[100];
    pthread_barrier_wait(&start); /* all threads hit malloc at the same moment */
    for (long r = 0; r < rounds; r++) {
        for (int i = 0; i < 100; i++) {
            size_t sz = hs_rand_range(&seed, 16, 2048);
            batch[i] = malloc(sz);
            if (!batch[i])
                abort();
            memset(batch[i], 0x33, sz);
            KEEP(batch[i]);
        }
        for (int i = 0; i < 100; i++)
            free(batch[i]);
    }
    void **kept = free_kept ? malloc(keep_kb * sizeof *kept) : NULL;
    if (free_kept && !kept)
        abort();
    for (long i = 0; i < keep_kb; i++) {
        void *p = malloc(1024);
        if (!p)
            abort();
        memset(p, 0x5a, 1024);
        KEEP(p); /* kept, never freed (unless --free-kept) */
        if (kept)
            kept[i] = p;
    }
    if (kept) {
        pthread_barrier_wait(&holding); /* the peak: every thread holds its blocks */
        hs_sleep_ms(50);
        pthread_barrier_wait(&holding);
        for (long i = 0; i < keep_kb; i++)
            free(kept[i]);
        free(kept);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"threads", &nthreads, NULL}, {"rounds", &rounds, NULL}, {"keep-kb", &keep_kb, NULL},
        {"free-kept", &free_kept, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (nthreads < 1) {
        fprintf(stderr, "%s: --threads must be >= 1\n", argv[0]);
        return 2;
    }

    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    pthread_barrier_init(&holding, NULL, (unsigned)nthreads);
    pthread_t *tids = malloc(nthreads * sizeof *tids);
    for (long t = 0; t < nthreads; t++)
        if (pthread_create(&tids[t], NULL, worker, (void *)(uintptr_t)t) != 0)
            abort();
    for (long t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&holding);
    printf("threads: threads=%ld kept_bytes=%ld\n", nthreads, nthreads * keep_kb * 1024);
    return 0;
}
