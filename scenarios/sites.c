/* hs-sites: call sites whose shares are known.
 * Three functions hold 50%, 30% and 20% of --mb MiB (96 by default) at the peak, in blocks
 * of mixed sizes (a quarter of each one's bytes in blocks of 32 B to 2 KiB, a quarter in
 * 16 KiB, half in 200 KiB ones that glibc maps on their own); then everything is freed but
 * one cache block in 8, and a fourth function allocates --leak-mb MiB (32) never freed.
 * Snapshots (through heapsight_snapshot, when heapsight runs it) at "loaded" (the peak) and
 * "freed". --index-x N: build_index allocates N times its share. Truth: usable bytes per
 * function at the peak and at exit, on one line. */
#include <malloc.h>
#include "scenario.h"

/* heapsight_snapshot.h's declaration: weak, so the program runs without heapsight too */
extern int heapsight_snapshot(const char *label) __attribute__((weak));
#define SNAPSHOT(label) (heapsight_snapshot ? heapsight_snapshot(label) : 0)

#define MAX_BLOCKS (1 << 20)
struct blocks {
    void *p[MAX_BLOCKS];
    long n;
    size_t usable;
};
static struct blocks rows, index_, cache, names;

/* One block of the mixed sizes, allocated right here (a macro, not a function: the
 * malloc call is on the caller's own line), counted with its usable size. */
#define ALLOC_MIXED(b, budget, seed)                                             \
    do {                                                                         \
        static const size_t small[] = {32, 96, 480, 2000};                       \
        size_t want = (b)->usable < (budget) / 4 ? small[hs_rand(seed) % 4]      \
                    : (b)->usable < (budget) / 2 ? 16384 : 200 * 1024;          \
        void *q = malloc(want);                                                  \
        memset(q, 1, want);                                                      \
        (b)->p[(b)->n++] = q;                                                    \
        (b)->usable += malloc_usable_size(q);                                    \
    } while (0)

__attribute__((noinline)) void load_rows(size_t bytes, uint64_t *seed) {
    while (rows.usable < bytes && rows.n < MAX_BLOCKS)
        ALLOC_MIXED(&rows, bytes, seed);
}

__attribute__((noinline)) void build_index(size_t bytes, uint64_t *seed) {
    while (index_.usable < bytes && index_.n < MAX_BLOCKS)
        ALLOC_MIXED(&index_, bytes, seed);
}

__attribute__((noinline)) void keep_cache(size_t bytes, uint64_t *seed) {
    while (cache.usable < bytes && cache.n < MAX_BLOCKS)
        ALLOC_MIXED(&cache, bytes, seed);
}

__attribute__((noinline)) void leak_names(size_t bytes, uint64_t *seed) {
    while (names.usable < bytes && names.n < MAX_BLOCKS)
        ALLOC_MIXED(&names, bytes, seed);
}

static void free_all(struct blocks *b, int keep_every) {
    size_t kept = 0;
    for (long i = 0; i < b->n; i++) {
        if (keep_every && i % keep_every == 0)
            kept += malloc_usable_size(b->p[i]);
        else
            free(b->p[i]);
    }
    b->usable = kept;
}

int main(int argc, char **argv) {
    long mb = 96, leak_mb = 32, index_x = 1;
    const struct hs_opt opts[] = {{"mb", &mb, NULL}, {"leak-mb", &leak_mb, NULL},
                                  {"index-x", &index_x, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    size_t total = (size_t)mb * MIB;
    load_rows(total / 2, &seed);
    build_index(total * 3 / 10 * (size_t)index_x, &seed);
    keep_cache(total / 5, &seed);
    size_t peak_rows = rows.usable, peak_index = index_.usable, peak_cache = cache.usable;
    SNAPSHOT("loaded");
    free_all(&rows, 0);
    free_all(&index_, 0);
    free_all(&cache, 8);
    SNAPSHOT("freed");
    leak_names((size_t)leak_mb * MIB, &seed);
    printf("sites: load_rows=%zu build_index=%zu keep_cache=%zu exit_keep_cache=%zu "
           "exit_leak_names=%zu\n", peak_rows, peak_index, peak_cache, cache.usable, names.usable);
    return 0;
}
