/* hs-peak: fixed four-phase program to cross-check peak live heap against heaptrack.
 * Truth: peak_live_bytes is the exact maximum of live requested bytes at any moment. */
#include "scenario.h"

#define MAX_BLOCKS 10000 /* phase 1 needs ~1980, phase 3 ~6991 */

/* Static bookkeeping, so the only heap traffic is the measured blocks. */
static void *blocks[MAX_BLOCKS];
static size_t sizes[MAX_BLOCKS];
static long nblocks, live, peak, total_allocs;

static void alloc_block(size_t sz)
{
    if (nblocks == MAX_BLOCKS)
        abort();
    void *p = malloc(sz);
    if (!p)
        abort();
    memset(p, 0x5a, sz);
    KEEP(p);
    blocks[nblocks] = p;
    sizes[nblocks++] = sz;
    total_allocs++;
    live += (long)sz;
    if (live > peak)
        peak = live;
}

static void free_block(long i)
{
    if (!blocks[i])
        return;
    free(blocks[i]);
    blocks[i] = NULL;
    live -= (long)sizes[i];
}

int main(int argc, char **argv)
{
    hs_parse(argc, argv, NULL, 0); /* no options */
    static const size_t cycle[] = {24, 100, 1000, 5000, 100000};

    /* Phase 1: 40 MiB of mixed sizes. */
    for (int k = 0; live < 40 * MIB; k = (k + 1) % 5)
        alloc_block(cycle[k]);
    /* Phase 2: free every other block. */
    for (long i = 0; i < nblocks; i += 2)
        free_block(i);
    /* Phase 3: 20 MiB more in 3000-byte blocks. */
    for (long added = 0; added < 20 * MIB; added += 3000)
        alloc_block(3000);
    /* Phase 4: free everything. */
    for (long i = 0; i < nblocks; i++)
        free_block(i);

    printf("peak: peak_live_bytes=%ld total_allocs=%ld\n", peak, total_allocs);
    return 0;
}
