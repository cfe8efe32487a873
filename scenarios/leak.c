/* hs-leak: a steady leak of random-sized (64..16384 B, fixed seed) blocks plus
 * short-lived churn. Truth: exactly leaked_bytes in leaked_blocks are never freed. */
#include "scenario.h"

int main(int argc, char **argv)
{
    long mb = 50, hold_ms = 100;
    const struct hs_opt opts[] = {{"mb", &mb, NULL}, {"hold-ms", &hold_ms, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);

    uint64_t seed = 0x9e3779b97f4a7c15ULL; /* fixed: same sizes every run */
    long target = mb * MIB, leaked_bytes = 0, leaked_blocks = 0;
    for (long iter = 1; leaked_bytes < target; iter++) {
        if (iter % 10 == 0) {
            /* Churn: a temporary block, freed at once (not part of the leak). */
            size_t t = hs_rand_range(&seed, 16, 4096);
            void *tmp = malloc(t);
            memset(tmp, 0x33, t);
            KEEP(tmp);
            free(tmp);
        }
        size_t sz = hs_rand_range(&seed, 64, 16384);
        void *p = malloc(sz);
        if (!p)
            abort();
        memset(p, 0x5a, sz);
        KEEP(p); /* and then the pointer is dropped: leaked */
        leaked_bytes += (long)sz;
        leaked_blocks++;
    }
    hs_sleep_ms(hold_ms);
    printf("leak: leaked_bytes=%ld leaked_blocks=%ld\n", leaked_bytes, leaked_blocks);
    return 0;
}
