/* hs-lab-arenas: threaded workers that allocate, hold and free big blocks, then what the
 * allocator kept, arena by arena, and what a release (malloc_trim(0) under glibc) gives back.
 *
 *   hs-lab-arenas --w30 N --w100 M [--mb-a 30] [--mb-b 100] [--rounds 10] [--hold-ms 100]
 *                 [--small 0|1] [--small-kb 4] [--pin-kb 0]
 *
 * N workers of kind A (--mb-a MiB each) and M of kind B (--mb-b MiB) start together behind a
 * barrier. Each round a worker allocates its size (one block, or with --small 1 many blocks
 * of --small-kb KiB), writes every byte, holds it for --hold-ms, frees it. After all workers
 * With --pin-kb K a worker also allocates, each round while it holds its memory, a K KiB
 * block it never frees (a result left behind): it sits above the freed memory in the arena,
 * so that memory is a free chunk in a bin instead of the arena's top. After all workers
 * are joined: RSS, glibc's arenas from malloc_info() and mallinfo2; then the allocator's
 * release (lab_release) and the same again.
 *
 * Output, one JSON object per line:
 *   {"event": "arena", "phase": "after_workers"|"after_release", "nr": i, "system": bytes,
 *    "free": bytes}                                   one per glibc arena
 *   {"event": "summary", ...}                         RSS and arena totals, both phases
 * Under another allocator there are no arena lines and the arena figures are 0. */
#include <pthread.h>
#include <stdatomic.h>

#include "lab.h"

#define MAX_ARENAS 4096

static long w_a = 0, w_b = 0, mb_a = 30, mb_b = 100, rounds = 10, hold_ms = 100;
static long small = 0, small_kb = 4, pin_kb = 0;
static pthread_barrier_t start;
static atomic_int running;

/* The block a worker leaves allocated each round (--pin-kb): live until the process ends. */
static void pin(void)
{
    if (!pin_kb)
        return;
    char *q = malloc((size_t)pin_kb * 1024);
    if (!q)
        abort();
    memset(q, 0x33, (size_t)pin_kb * 1024);
    KEEP(q);
}

/* One worker: `rounds` times allocate `bytes`, write it all, hold it, free it. */
static void *worker(void *arg)
{
    size_t bytes = (size_t)(uintptr_t)arg;
    size_t block = small ? (size_t)small_kb * 1024 : bytes;
    size_t nblocks = (bytes + block - 1) / block;
    void **blocks = NULL;

    pthread_barrier_wait(&start);
    if (nblocks > 1) {
        blocks = malloc(nblocks * sizeof *blocks); /* from this thread's arena, as the blocks */
        if (!blocks)
            abort();
    }
    for (long r = 0; r < rounds; r++) {
        if (nblocks == 1) {
            char *p = malloc(block);
            if (!p)
                abort();
            memset(p, 0x5a, block);
            KEEP(p);
            pin();
            hs_sleep_ms(hold_ms);
            free(p);
        } else {
            for (size_t i = 0; i < nblocks; i++) {
                blocks[i] = malloc(block);
                if (!blocks[i])
                    abort();
                memset(blocks[i], 0x5a, block);
                KEEP(blocks[i]);
            }
            pin();
            hs_sleep_ms(hold_ms);
            for (size_t i = 0; i < nblocks; i++)
                free(blocks[i]);
        }
    }
    free(blocks);
    atomic_fetch_sub(&running, 1);
    return NULL;
}

/* glibc's arenas as malloc_info() describes them. */
typedef struct {
    int count;              /* <heap nr=...> blocks */
    long long system[MAX_ARENAS]; /* each arena's <system type="current"> */
    long long freeb[MAX_ARENAS];  /* each arena's free bytes: fast + rest totals (top included) */
    long long system_total; /* the <system type="current"> after the heaps */
    long long mmap_count, mmap_size; /* <total type="mmap"> */
} arenas_t;

static long long attr_num(const char *line, const char *attr)
{
    const char *p = strstr(line, attr);
    return p ? atoll(p + strlen(attr)) : 0;
}

static void read_arenas(arenas_t *a)
{
    memset(a, 0, sizeof *a);
    if (strcmp(lab_allocator(), "glibc") != 0)
        return;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return;
    malloc_info(0, f);
    fclose(f);
    int cur = -1; /* index of the heap being read, -1 outside */
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = 0;
        if (strstr(line, "<heap nr=")) {
            cur = a->count < MAX_ARENAS ? a->count : -1;
            a->count++;
        } else if (strstr(line, "</heap>")) {
            cur = -1;
        } else if (strstr(line, "<system type=\"current\"")) {
            long long v = attr_num(line, "size=\"");
            if (cur >= 0)
                a->system[cur] = v;
            else
                a->system_total = v;
        } else if (cur >= 0 && (strstr(line, "<total type=\"fast\"") ||
                                strstr(line, "<total type=\"rest\""))) {
            a->freeb[cur] += attr_num(line, "size=\"");
        } else if (cur < 0 && strstr(line, "<total type=\"mmap\"")) {
            a->mmap_count = attr_num(line, "count=\"");
            a->mmap_size = attr_num(line, "size=\"");
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
}

static void print_arenas(const char *phase, const arenas_t *a)
{
    int n = a->count < MAX_ARENAS ? a->count : MAX_ARENAS;
    for (int i = 0; i < n; i++) {
        lab_json_begin();
        lab_json_str("event", "arena");
        lab_json_str("phase", phase);
        lab_json_num("nr", i);
        lab_json_num("system", a->system[i]);
        lab_json_num("free", a->freeb[i]);
        lab_json_end();
    }
}

static long long largest(const arenas_t *a)
{
    long long m = 0;
    int n = a->count < MAX_ARENAS ? a->count : MAX_ARENAS;
    for (int i = 0; i < n; i++)
        if (a->system[i] > m)
            m = a->system[i];
    return m;
}

static arenas_t before, after; /* big: kept off the stack */

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"w30", &w_a, NULL},       {"w100", &w_b, NULL},         {"mb-a", &mb_a, NULL},
        {"mb-b", &mb_b, NULL},     {"rounds", &rounds, NULL},    {"hold-ms", &hold_ms, NULL},
        {"small", &small, NULL},   {"small-kb", &small_kb, NULL}, {"pin-kb", &pin_kb, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    long nthreads = w_a + w_b;
    if (nthreads < 1 || nthreads > 4096) {
        fprintf(stderr, "%s: --w30 + --w100 must be between 1 and 4096\n", argv[0]);
        return 2;
    }
    if (mb_a < 1 || mb_b < 1 || mb_a > 65536 || mb_b > 65536) {
        fprintf(stderr, "%s: --mb-a and --mb-b must be between 1 and 65536\n", argv[0]);
        return 2;
    }
    if (small > 1 || small_kb < 1 || small_kb > 1024 * 1024 || pin_kb > 1024) {
        fprintf(stderr, "%s: --small is 0 or 1, --small-kb between 1 and 1048576, "
                "--pin-kb at most 1024\n", argv[0]);
        return 2;
    }

    lab_mem_t base = lab_mem();
    double t0 = hs_now();
    pthread_t *tids = malloc(nthreads * sizeof *tids);
    if (!tids)
        abort();
    atomic_store(&running, (int)nthreads);
    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    for (long t = 0; t < nthreads; t++) {
        size_t bytes = (size_t)(t < w_a ? mb_a : mb_b) * (size_t)MIB;
        if (pthread_create(&tids[t], NULL, worker, (void *)(uintptr_t)bytes) != 0) {
            fprintf(stderr, "%s: cannot start thread %ld\n", argv[0], t + 1);
            return 1;
        }
    }
    long long peak = 0; /* RSS sampled every 5 ms while workers run */
    while (atomic_load(&running) > 0) {
        lab_mem_t m = lab_mem();
        if (m.rss > peak)
            peak = m.rss;
        hs_sleep_ms(5);
    }
    for (long t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    pthread_barrier_destroy(&start);
    double work_s = hs_now() - t0;

    read_arenas(&before); /* first: its buffer is then in both RSS figures, not in the change */
    struct mallinfo2 mi1 = lab_mallinfo2();
    lab_mem_t m1 = lab_mem();
    if (m1.rss > peak)
        peak = m1.rss;

    double t1 = hs_now();
    int released = lab_release();
    double release_s = hs_now() - t1;

    lab_mem_t m2 = lab_mem();
    struct mallinfo2 mi2 = lab_mallinfo2();
    read_arenas(&after);

    print_arenas("after_workers", &before);
    print_arenas("after_release", &after);
    lab_json_begin();
    lab_json_str("event", "summary");
    lab_json_str("allocator", lab_allocator());
    lab_json_num("w30", w_a);
    lab_json_num("w100", w_b);
    lab_json_num("mb_a", mb_a);
    lab_json_num("mb_b", mb_b);
    lab_json_num("rounds", rounds);
    lab_json_num("hold_ms", hold_ms);
    lab_json_num("small", small);
    lab_json_num("small_kb", small_kb);
    lab_json_num("pin_kb", pin_kb);
    lab_json_num("threads", nthreads);
    lab_json_num("cores", sysconf(_SC_NPROCESSORS_ONLN));
    lab_json_num("rss_base", base.rss);
    lab_json_num("rss_peak", peak);
    lab_json_num("rss_after", m1.rss);
    lab_json_num("vm_after", m1.vm);
    lab_json_num("rss_release", m2.rss);
    lab_json_num("vm_release", m2.vm);
    lab_json_num("released", released);
    lab_json_real("work_s", work_s);
    lab_json_real("release_s", release_s);
    lab_json_num("arenas", before.count);
    lab_json_num("arena_system", before.system_total);
    lab_json_num("arena_largest", largest(&before));
    lab_json_num("arena_main", before.count ? before.system[0] : 0);
    lab_json_num("mmap_count", before.mmap_count);
    lab_json_num("mmap_size", before.mmap_size);
    lab_json_num("arenas_release", after.count);
    lab_json_num("arena_system_release", after.system_total);
    lab_json_num("mi_arena", (long long)mi1.arena);
    lab_json_num("mi_hblkhd", (long long)mi1.hblkhd);
    lab_json_num("mi_fordblks", (long long)mi1.fordblks);
    lab_json_num("mi_uordblks", (long long)mi1.uordblks);
    lab_json_num("mi_arena_release", (long long)mi2.arena);
    lab_json_num("mi_fordblks_release", (long long)mi2.fordblks);
    lab_json_end();
    return 0;
}
