/* hs-lab-waste: internal fragmentation of many small blocks, the way the write-up
 * "Malloc internal memory fragmentation footprint" tabulated it.
 *
 * One case = allocate blocks of one fixed size (or of uniform random sizes in [1, max])
 * until the requested bytes reach the target, keep them all, and measure. Each case runs
 * in a fork()ed child so that it starts from the same small heap: the child allocates,
 * measures, prints its JSON line and _exit(0)s; the parent checks how it ended.
 *
 *   hs-lab-waste [--target-kb N,N...] [--fixed S,S...] [--random-max M,M...] [--seed S]
 *
 * Lists are comma-separated positive numbers; an empty list (or "none") runs no case of
 * that kind. Output, one JSON object per line:
 *   {"kind": "meta", "allocator": ..., "seed": ...}                      first
 *   {"kind": "case", "mode": "fixed"|"random", "target": ..., "param": ...,
 *    "count", "min", "max", "total" (requested), "usable" (sum of malloc_usable_size),
 *    "allocated", "free", "in_use": the allocator's own figures (see stats_after),
 *    "rss_growth", "vm_growth" (after - before the allocations, in the child),
 *    "base_in_use" (glibc: mallinfo2 uordblks before the allocations, else -1),
 *    glibc only: "mi2_arena", "mi2_hblkhd", "mi2_fordblks", "mi2_uordblks",
 *                "mi_arena", "mi_hblkhd" (the old int mallinfo, sign-extended),
 *    jemalloc only: "je_resident", "je_metadata",
 *    "seconds"}
 *   {"kind": "error", "mode": ..., "target": ..., "param": ..., "why": ...}   a failed case
 * Exit 0 when every case ran, 1 when one failed, 2 on bad arguments.
 *
 * The blocks are never freed and their pointers are not stored: each block's usable size
 * is added up right after its malloc, KEEP() stops gcc from dropping the malloc, and the
 * child ends with _exit. So no pointer table sits in the heap being measured (at 100 MB of
 * 1-byte blocks such a table would be 800 MB of its own). */
#include <errno.h>
#include <sys/wait.h>

#include "lab.h"

#define MAX_LIST 64

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef int (*tc_prop_fn)(const char *, size_t *);

/* Resolved in the parent, before any fork: a failed dlsym allocates its error message,
 * which must not land in a measured heap. */
static const char *allocator;
static mallctl_fn je_mallctl;
static tc_prop_fn tc_prop;

struct list {
    long v[MAX_LIST];
    int n;
};

static void bad_arg(const char *prog, const char *what, const char *text)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, text);
    exit(2);
}

/* "1,2,48" -> list; "" or "none" -> empty. Every entry must be a positive number. */
static void parse_list(const char *prog, const char *opt, const char *text, struct list *out)
{
    out->n = 0;
    if (!*text || strcmp(text, "none") == 0)
        return;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x <= 0 || (*end != ',' && *end != 0))
            bad_arg(prog, opt, text);
        if (out->n == MAX_LIST)
            bad_arg(prog, "too many values in", opt);
        out->v[out->n++] = x;
        if (!*end)
            break;
        p = end + 1;
    }
}

static long long tc_get(const char *name)
{
    size_t v = 0;
    return tc_prop && tc_prop(name, &v) ? (long long)v : -1;
}

static long long je_get(const char *name)
{
    size_t v = 0, len = sizeof v;
    return je_mallctl && je_mallctl(name, &v, &len, NULL, 0) == 0 ? (long long)v : -1;
}

/* The allocator's own account after the allocations, printed as allocated/free/in_use:
 *  glibc     allocated = mallinfo2 arena + hblkhd (obtained from the system),
 *            free = fordblks, in_use = uordblks; plus the old int mallinfo for comparison
 *  jemalloc  allocated = stats.active (pages of active extents), in_use = stats.allocated
 *  tcmalloc  allocated = heap_size - pageheap free - pageheap unmapped,
 *            in_use = generic.current_allocated_bytes
 *  others    allocated = RSS growth; free and in_use are not known (-1). */
static void stats_after(long long rss_growth)
{
    long long allocated = rss_growth, freeb = -1, in_use = -1;
    if (strcmp(allocator, "glibc") == 0) {
        struct mallinfo2 m2 = mallinfo2();
        /* mallinfo is deprecated because its int fields overflow past 2 GiB; it is
         * called here precisely to show that overflow next to mallinfo2. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
        allocated = (long long)(m2.arena + m2.hblkhd);
        freeb = (long long)m2.fordblks;
        in_use = (long long)m2.uordblks;
        lab_json_num("mi2_arena", (long long)m2.arena);
        lab_json_num("mi2_hblkhd", (long long)m2.hblkhd);
        lab_json_num("mi2_fordblks", (long long)m2.fordblks);
        lab_json_num("mi2_uordblks", (long long)m2.uordblks);
        lab_json_num("mi_arena", m.arena);
        lab_json_num("mi_hblkhd", m.hblkhd);
    } else if (strcmp(allocator, "jemalloc") == 0 && je_mallctl) {
        uint64_t epoch = 1;
        je_mallctl("epoch", NULL, NULL, &epoch, sizeof epoch);
        allocated = je_get("stats.active");
        in_use = je_get("stats.allocated");
        freeb = allocated >= 0 && in_use >= 0 ? allocated - in_use : -1;
        lab_json_num("je_resident", je_get("stats.resident"));
        lab_json_num("je_metadata", je_get("stats.metadata"));
    } else if (strcmp(allocator, "tcmalloc") == 0 && tc_prop) {
        long long heap = tc_get("generic.heap_size");
        long long pfree = tc_get("tcmalloc.pageheap_free_bytes");
        long long unmapped = tc_get("tcmalloc.pageheap_unmapped_bytes");
        in_use = tc_get("generic.current_allocated_bytes");
        allocated = heap >= 0 && pfree >= 0 && unmapped >= 0 ? heap - pfree - unmapped : -1;
        freeb = allocated >= 0 && in_use >= 0 ? allocated - in_use : -1;
    }
    lab_json_num("allocated", allocated);
    lab_json_num("free", freeb);
    lab_json_num("in_use", in_use);
}

/* The child's whole life: allocate up to target, measure, print. */
static void run_case(int random, long target, long param, uint64_t seed)
{
    uint64_t rng = seed ? seed : 1;
    long long count = 0, total = 0, usable = 0;
    long lo = 0, hi = 0;
    lab_mem_t before = lab_mem();
    /* glibc: what the heap already held (stdout's buffer, inherited from the parent) */
    long long base_in_use = strcmp(allocator, "glibc") == 0 ? (long long)mallinfo2().uordblks : -1;
    double t0 = hs_now();
    while (total < target) {
        size_t n = random ? hs_rand_range(&rng, 1, (size_t)param) : (size_t)param;
        char *p = malloc(n);
        if (!p) {
            fprintf(stderr, "malloc(%zu) failed after %lld blocks\n", n, count);
            _exit(1);
        }
        memset(p, 0xA5, n); /* every byte written, so every page holding a block is resident */
        KEEP(p);
        usable += (long long)malloc_usable_size(p);
        total += (long long)n;
        if (count == 0 || (long)n < lo)
            lo = (long)n;
        if ((long)n > hi)
            hi = (long)n;
        count++;
    }
    double secs = hs_now() - t0;
    lab_mem_t after = lab_mem();
    lab_json_begin();
    lab_json_str("kind", "case");
    lab_json_str("mode", random ? "random" : "fixed");
    lab_json_num("target", target);
    lab_json_num("param", param);
    lab_json_num("count", count);
    lab_json_num("min", lo);
    lab_json_num("max", hi);
    lab_json_num("total", total);
    lab_json_num("usable", usable);
    lab_json_num("rss_growth", after.rss - before.rss);
    lab_json_num("vm_growth", after.vm - before.vm);
    lab_json_num("base_in_use", base_in_use);
    stats_after(after.rss - before.rss);
    lab_json_real("seconds", secs);
    lab_json_end();
}

/* Runs one case in a child; returns 0 if it printed its line and exited 0. */
static int fork_case(int random, long target, long param, uint64_t seed)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return -1;
    }
    if (pid == 0) {
        run_case(random, target, param, seed);
        _exit(0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            perror("waitpid");
            return -1;
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    char why[64];
    if (WIFSIGNALED(status))
        snprintf(why, sizeof why, "killed_by_signal_%d", WTERMSIG(status));
    else
        snprintf(why, sizeof why, "exit_status_%d", WEXITSTATUS(status));
    lab_json_begin();
    lab_json_str("kind", "error");
    lab_json_str("mode", random ? "random" : "fixed");
    lab_json_num("target", target);
    lab_json_num("param", param);
    lab_json_str("why", why);
    lab_json_end();
    return -1;
}

int main(int argc, char **argv)
{
    const char *targets_s = "1024,10240,102400";
    const char *fixed_s = "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,"
                          "25,26,27,28,29,30,31,32,48,64,128,256,512,1024,2048";
    const char *random_s = "32,48,64,128,256,512,1024,2048";
    long seed = 12345;
    const struct hs_opt opts[] = {
        {"target-kb", NULL, &targets_s},
        {"fixed", NULL, &fixed_s},
        {"random-max", NULL, &random_s},
        {"seed", &seed, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    struct list targets, fixed, randmax;
    parse_list(argv[0], "--target-kb", targets_s, &targets);
    parse_list(argv[0], "--fixed", fixed_s, &fixed);
    parse_list(argv[0], "--random-max", random_s, &randmax);
    if (targets.n == 0)
        bad_arg(argv[0], "--target-kb", "needs at least one target");
    for (int i = 0; i < targets.n; i++)
        if (targets.v[i] > 64L * 1024 * 1024) /* 64 GiB of requested bytes */
            bad_arg(argv[0], "--target-kb too large", targets_s);

    allocator = lab_allocator();
    if (strcmp(allocator, "jemalloc") == 0)
        je_mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    if (strcmp(allocator, "tcmalloc") == 0)
        tc_prop = (tc_prop_fn)dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty");

    /* stdout's buffer lives outside the heap, so the measured heap holds the blocks and
     * next to nothing else (glibc would otherwise malloc 4 KiB for it at the first printf,
     * 0.4% of a 1 MB case). */
    static char outbuf[1 << 16];
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    lab_json_begin();
    lab_json_str("kind", "meta");
    lab_json_str("allocator", allocator);
    lab_json_num("seed", seed);
    lab_json_num("page_size", sysconf(_SC_PAGESIZE));
    lab_json_end();

    int failed = 0;
    for (int t = 0; t < targets.n; t++) {
        long target = targets.v[t] * 1024L;
        for (int i = 0; i < fixed.n; i++)
            failed |= fork_case(0, target, fixed.v[i], (uint64_t)seed) != 0;
        for (int i = 0; i < randmax.n; i++)
            failed |= fork_case(1, target, randmax.v[i], (uint64_t)seed) != 0;
    }
    return failed ? 1 : 0;
}
