/* hs-smallwaste: a million tiny mallocs; each costs a 32-byte chunk, so RSS is far
 * above the requested bytes. Truth: requested_bytes = count*size live during the hold. */
#include <sys/mman.h>

#include "scenario.h"

int main(int argc, char **argv)
{
    long count = 1000000, size = 1, hold_ms = 100, do_free = 0;
    const struct hs_opt opts[] = {
        {"count", &count, NULL}, {"size", &size, NULL},
        {"hold-ms", &hold_ms, NULL}, {"free", &do_free, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (do_free > 1) {
        fprintf(stderr, "%s: --free must be 0 or 1\n", argv[0]);
        return 2;
    }

    /* With --free 1 the pointers must be remembered. The table is mmap'd directly,
     * not malloc'd, so malloc-level live bytes stay exactly count*size. */
    void **tab = NULL;
    if (do_free) {
        tab = mmap(NULL, count * sizeof *tab + 1, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (tab == MAP_FAILED)
            abort();
    }
    for (long i = 0; i < count; i++) {
        char *p = malloc(size);
        if (!p)
            abort();
        if (size > 0)
            p[0] = 1; /* one byte written per block */
        KEEP(p);
        if (tab)
            tab[i] = p;
    }
    hs_sleep_ms(hold_ms);
    if (tab) {
        for (long i = 0; i < count; i++)
            free(tab[i]);
        munmap(tab, count * sizeof *tab + 1);
    }
    printf("smallwaste: count=%ld size=%ld requested_bytes=%ld\n", count, size, count * size);
    return 0;
}
