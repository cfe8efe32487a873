/* hs-churn-peak: a peak built after heavy churn, for the sampling of call sites (issue 31).
 * First --churn-mib MiB (default 2048) of small blocks (16-256 B) are allocated and freed
 * through a ring of 1,024 slots (churn_block), then --peak-mib MiB (default 64) of small
 * blocks (16-256 B) are kept from two functions, peak_a (3 in 4) and peak_b; the program
 * prints "peak=BYTES blocks=N" with them all live, then frees everything. */
#include "scenario.h"

static long churn_mib = 2048, peak_mib = 64, seed = 7;

__attribute__((noinline)) void *churn_block(size_t n) { void *p = malloc(n); KEEP(p); return p; }
__attribute__((noinline)) void *peak_a(size_t n) { void *p = malloc(n); KEEP(p); return p; }
__attribute__((noinline)) void *peak_b(size_t n) { void *p = malloc(n); KEEP(p); return p; }

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"churn-mib", &churn_mib, NULL}, {"peak-mib", &peak_mib, NULL}, {"seed", &seed, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    uint64_t s = (uint64_t)seed;
    static void *ring[1024];
    for (size_t left = (size_t)churn_mib << 20; left;) {
        size_t n = hs_rand_range(&s, 16, 256), k = hs_rand(&s) % 1024;
        free(ring[k]);
        if (!(ring[k] = churn_block(n)))
            abort();
        left = left > n ? left - n : 0;
    }
    for (size_t k = 0; k < 1024; k++) {
        free(ring[k]);
        ring[k] = NULL;
    }
    size_t cap = 1 << 16, used = 0, bytes = 0;
    void **kept = malloc(cap * sizeof *kept);
    while (bytes < (size_t)peak_mib << 20) {
        size_t n = hs_rand_range(&s, 16, 256);
        void *p = hs_rand(&s) % 4 ? peak_a(n) : peak_b(n);
        if (!p)
            abort();
        if (used == cap && !(kept = realloc(kept, (cap *= 2) * sizeof *kept)))
            abort();
        kept[used++] = p;
        bytes += n;
    }
    printf("peak=%zu blocks=%zu\n", bytes, used);
    fflush(stdout);
    for (size_t i = 0; i < used; i++)
        free(kept[i]);
    free(kept);
    return 0;
}
