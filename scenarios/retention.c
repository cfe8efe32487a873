/* hs-retention: per-thread arenas fill up, then all but every keep_every-th block is freed.
 * Truth: only kept*block bytes are live, yet RSS stays near --mb; kept_pages: their pages. */
#include <pthread.h>
#include <sys/mman.h>
#include "scenario.h"

static long nthreads = 8, mb = 256, block = 1024, keep_every = 64, hold_ms = 200, peak_ms = 0;
static long per_thread, kept_per_thread; /* blocks allocated, and kept, by each thread */
static pthread_barrier_t barrier; static unsigned long *kept_pages; /* see main */

static void *worker(void *arg)
{
    unsigned long *pages = kept_pages + 2 * kept_per_thread * (long)(intptr_t)arg;
    /* Bookkeeping table; freed below so it is not part of the truth. */
    void **ptrs = malloc(per_thread * sizeof *ptrs);
    if (!ptrs)
        abort();
    for (long i = 0; i < per_thread; i++) {
        ptrs[i] = malloc(block);
        if (!ptrs[i])
            abort();
        memset(ptrs[i], 0x5a, block); /* make it resident */
        KEEP(ptrs[i]);
    }
    /* Everyone holds their peak at the same time before freeing (for --peak-ms). */
    pthread_barrier_wait(&barrier);
    if (peak_ms > 0)
        hs_sleep_ms(peak_ms);
    /* Keep every keep_every-th block: the survivors pin the arena's pages. */
    for (long i = 0; i < per_thread; i++) {
        if (i % keep_every != 0) {
            free(ptrs[i]);
        } else {
            *pages++ = (unsigned long)(uintptr_t)ptrs[i] >> 12;
            *pages++ = ((unsigned long)(uintptr_t)ptrs[i] + block - 1) >> 12;
        }
    }
    free(ptrs);
    return NULL;
}

static int by_value(const void *a, const void *b)
{
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"threads", &nthreads, NULL}, {"mb", &mb, NULL},           {"block", &block, NULL},
        {"keep-every", &keep_every, NULL}, {"hold-ms", &hold_ms, NULL},
        {"peak-ms", &peak_ms, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (nthreads < 1 || block < 1 || keep_every < 1) {
        fprintf(stderr, "%s: --threads, --block and --keep-every must be >= 1\n", argv[0]);
        return 2;
    }

    per_thread = mb * MIB / nthreads / block;
    kept_per_thread = (per_thread + keep_every - 1) / keep_every; /* i = 0, k, 2k, ... */
    /* the kept blocks' first and last pages, two per kept block, thread by thread: mapped
     * apart from the heap, so that the record is no block of its own */
    size_t record = 2 * (size_t)kept_per_thread * (size_t)nthreads * sizeof *kept_pages;
    kept_pages = mmap(NULL, record + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (kept_pages == MAP_FAILED)
        abort();
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    pthread_t *tids = malloc(nthreads * sizeof *tids);
    for (long t = 0; t < nthreads; t++)
        if (pthread_create(&tids[t], NULL, worker, (void *)(intptr_t)t) != 0)
            abort();
    for (long t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    pthread_barrier_destroy(&barrier);

    long kept = kept_per_thread * nthreads, distinct = 0;
    qsort(kept_pages, 2 * (size_t)kept, sizeof *kept_pages, by_value);
    for (long i = 0; i < 2 * kept; i++)
        distinct += i == 0 || kept_pages[i] != kept_pages[i - 1];
    hs_sleep_ms(hold_ms);
    /* Return without freeing the kept blocks. */
    printf("retention: threads=%ld blocks=%ld block_bytes=%ld kept=%ld live_bytes=%ld "
           "kept_pages=%ld\n", nthreads, per_thread * nthreads, block, kept, kept * block,
           distinct);
    return 0;
}
