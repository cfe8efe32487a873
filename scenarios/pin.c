/* pin.c: a freed heap pinned by a few kept blocks, with a layout known to the byte.
 *
 * Fills --mib MiB of heap in cycles of --every bytes: keeper() allocates one small block
 * (--keep bytes), filler() the rest of the cycle. Then every filler block is freed: the
 * heap is almost all free, but each cycle's first page holds a keeper block, which a
 * release (malloc_trim) cannot return. With --every 4096 every page is pinned: nothing
 * comes back. With --free-keepers 1 the keepers are freed too: nothing pins.
 *
 * The cycles start on a page boundary (pad blocks first), so keeper i sits at
 * first + i * every, in the first bytes of its page (glibc; "contiguous=1" says so). --threads N runs N threads doing the
 * same each in its own arena (glibc's thread arenas), --mib each.
 *
 * Then: --hold 1 prints "pin: ready" and waits until its standard input closes, with a
 * malloc and a free for each read (a map asked for meanwhile is taken at such a call, on
 * the program's own thread); then it exits. Prints "pin: keepers=N keep=B every=E mib=M
 * threads=T first=0x... contiguous=0|1 freed_keepers=0|1"; --addrs FILE writes every
 * keeper's address, one hexadecimal per line, for the tests to check the map against. */
#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include "scenario.h"

static long g_mib = 64, g_every = 4096, g_keep = 40, g_threads = 0, g_hold = 0, g_free_keepers = 0;
static const char *g_addrs = NULL;

struct work {
    void **keepers, **fillers;
    size_t n;
    int contiguous;
};

/* Not static: exported (ENABLE_EXPORTS), the call sites keep their names in the installed,
 * stripped program. */
__attribute__((noinline)) void *keeper(size_t bytes)
{
    void *p = malloc(bytes);
    memset(p, 0x6b, bytes);
    KEEP(p);
    return p;
}

__attribute__((noinline)) void *filler(size_t bytes)
{
    void *p = malloc(bytes);
    memset(p, 0x66, bytes);
    KEEP(p);
    return p;
}

/* glibc's chunk for a request: 8 bytes of header, 16-byte steps, 32 at least */
static size_t chunk_of(size_t request)
{
    size_t c = (request + 8 + 15) & ~(size_t)15;
    return c < 32 ? 32 : c;
}

/* Brings the arena's top chunk to a page boundary and returns where it starts, so the
 * cycles that follow start on one (allocations this large come from the top, in order).
 * The two blocks stay: freed, they would be carved for the small blocks that follow. */
__attribute__((noinline)) static uintptr_t align_top(void **pads)
{
    char *probe = malloc(64 * 1024);
    uintptr_t top = (uintptr_t)(probe - 16) + malloc_usable_size(probe) + 8;
    size_t gap = (4096 - top % 4096) % 4096;
    pads[0] = probe;
    pads[1] = malloc(gap + 64 * 1024 - 8);   /* a chunk of exactly gap + 64 KiB */
    return top + gap + 64 * 1024;
}

/* The first keeper, from the top chunk: blocks of its size left free in the bins by
 * earlier code are taken first and parked (kept, never freed). */
__attribute__((noinline)) static void *first_keeper(uintptr_t top, void **parked, int *n_parked)
{
    for (int i = 0; i < 256; i++) {
        void *p = keeper((size_t)g_keep);
        if ((uintptr_t)p == top + 16)
            return p;
        parked[(*n_parked)++] = p;
    }
    return keeper((size_t)g_keep);
}

static pthread_barrier_t g_all_done;

static void *run(void *arg)
{
    struct work *w = arg;
    size_t keep_chunk = chunk_of((size_t)g_keep);
    size_t fill_req = (size_t)g_every - keep_chunk - 8;
    w->n = (size_t)g_mib * MIB / (size_t)g_every;
    w->keepers = calloc(w->n, sizeof *w->keepers);
    w->fillers = calloc(w->n, sizeof *w->fillers);
    void *pads[2], *parked[256];
    int n_parked = 0;
    uintptr_t top = align_top(pads);
    w->contiguous = 1;
    for (size_t i = 0; i < w->n; i++) {
        w->keepers[i] = i ? keeper((size_t)g_keep) : first_keeper(top, parked, &n_parked);
        w->fillers[i] = filler(fill_req);
        if (i && (char *)w->keepers[i] - (char *)w->keepers[i - 1] != g_every)
            w->contiguous = 0;
    }
    for (size_t i = 0; i < w->n; i++)
        free(w->fillers[i]);
    if (g_free_keepers)
        for (size_t i = 0; i < w->n; i++)
            free(w->keepers[i]);
    w->contiguous &= (uintptr_t)w->keepers[0] == top + 16;
    KEEP(pads);
    KEEP(parked);
    /* no thread ends before every one has its arena: glibc gives an ended thread's arena
     * to the next thread that starts, and each thread is to have its own */
    if (g_threads)
        pthread_barrier_wait(&g_all_done);
    return NULL;
}

int main(int argc, char **argv)
{
    struct hs_opt opts[] = {
        {"mib", &g_mib, NULL},         {"every", &g_every, NULL},
        {"keep", &g_keep, NULL},       {"threads", &g_threads, NULL},
        {"hold", &g_hold, NULL},       {"free-keepers", &g_free_keepers, NULL},
        {"addrs", NULL, &g_addrs},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof *opts);
    if (g_every < 4096 || g_every % 16 || g_keep < 1 || g_keep > 1000 || g_threads > 64) {
        fprintf(stderr, "pin: --every is at least 4096 and a multiple of 16, --keep 1..1000\n");
        return 2;
    }
    /* stdio's blocks come before the heap is filled: allocated after, they would land on
     * the keepers' pages */
    static char outbuf[BUFSIZ], addrbuf[BUFSIZ];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    FILE *addrs = NULL;
    if (g_addrs) {
        addrs = fopen(g_addrs, "w");
        if (!addrs) {
            perror(g_addrs);
            return 1;
        }
        setvbuf(addrs, addrbuf, _IOFBF, sizeof addrbuf);
    }
    int nw = g_threads ? (int)g_threads : 1;
    struct work works[64];
    memset(works, 0, sizeof works);
    if (g_threads) {
        pthread_t t[64];
        pthread_barrier_init(&g_all_done, NULL, (unsigned)nw);
        for (int i = 0; i < nw; i++)
            pthread_create(&t[i], NULL, run, &works[i]);
        for (int i = 0; i < nw; i++)
            pthread_join(t[i], NULL);
    } else {
        run(&works[0]);
    }
    int contiguous = 1;
    size_t keepers = 0;
    for (int i = 0; i < nw; i++) {
        contiguous &= works[i].contiguous;
        keepers += works[i].n;
    }
    if (addrs) {
        for (int i = 0; i < nw; i++)
            for (size_t k = 0; k < works[i].n; k++)
                fprintf(addrs, "%lx\n", (unsigned long)(uintptr_t)works[i].keepers[k]);
        fclose(addrs);
    }
    printf("pin: keepers=%zu keep=%ld every=%ld mib=%ld threads=%ld first=%p contiguous=%d "
           "freed_keepers=%ld\n", keepers, g_keep, g_every, g_mib, g_threads,
           works[0].keepers[0], contiguous, g_free_keepers);
    fflush(stdout);
    if (g_hold) {
        printf("pin: ready\n");
        fflush(stdout);
        char buf[256];
        while (read(0, buf, sizeof buf) > 0) { /* an allocator call for each read: where a */
            void *volatile one = malloc(16);   /* map asked for meanwhile is taken */
            free(one);
        }
    }
    return 0;
}
