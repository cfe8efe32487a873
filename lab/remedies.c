/* hs-lab-remedies: threads that keep a few long-lived blocks, and the RSS they leave behind.
 *
 *   hs-lab-remedies [--threads 8] [--waves 6] [--per-wave 60000] [--min 100] [--max 400]
 *                   [--keep-every 500] [--trim 0|1]
 *
 * --threads workers start together behind a barrier. Each runs --waves waves: it allocates
 * --per-wave blocks of --min..--max bytes (uniform, its own deterministic PRNG), writes
 * every byte (a string being filled), and at the end of the wave frees all of them but
 * every --keep-every'th, which it puts in a cache shared by all workers (a growing array
 * of pointers behind one mutex) and never frees: a few long-lived entries among many
 * short-lived ones. When all workers have been joined the program reads its RSS ("the RSS
 * kept after the work"); with --trim 1 it then calls malloc_trim(0) and reads it again.
 *
 * RSS is read from /proc/self/statm (resident pages x page size) with open/read into a
 * stack buffer: reading it allocates nothing. Output: one JSON object on stdout,
 *   {"event": "result", "allocator": ..., "rss_start": bytes, "rss_after": bytes,
 *    "rss_trim": bytes (= rss_after without --trim), "work_s": s, "trim_s": s, ...}
 * Exit 0 on success, 2 on bad arguments. */
#include <pthread.h>

#include "lab.h"

static long threads = 8, waves = 6, per_wave = 60000, min_size = 100, max_size = 400;
static long keep_every = 500, trim = 0;
static pthread_barrier_t start;

/* The cache the workers share: the blocks kept, never freed. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static void **cache;
static size_t cache_len, cache_cap;
static long long cache_bytes;

static void cache_put(void *p, size_t size)
{
    pthread_mutex_lock(&cache_lock);
    if (cache_len == cache_cap) {
        size_t cap = cache_cap ? 2 * cache_cap : 256;
        void **grown = realloc(cache, cap * sizeof *grown);
        if (!grown)
            abort();
        cache = grown;
        cache_cap = cap;
    }
    cache[cache_len++] = p;
    cache_bytes += (long long)size;
    pthread_mutex_unlock(&cache_lock);
}

/* Resident bytes of this process from /proc/self/statm (0 when it is unreadable). */
static long long rss_statm(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    long long size = 0, resident = 0;
    if (sscanf(buf, "%lld %lld", &size, &resident) != 2)
        return 0;
    return resident * (long long)sysconf(_SC_PAGESIZE);
}

static void *worker(void *arg)
{
    uint64_t seed = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uintptr_t)arg * 0x2545f4914f6cdd1dULL);
    char **blocks = malloc((size_t)per_wave * sizeof *blocks);
    size_t *sizes = malloc((size_t)per_wave * sizeof *sizes);
    if (!blocks || !sizes)
        abort();
    pthread_barrier_wait(&start);
    for (long w = 0; w < waves; w++) {
        for (long i = 0; i < per_wave; i++) {
            size_t size = hs_rand_range(&seed, (size_t)min_size, (size_t)max_size);
            char *p = malloc(size);
            if (!p)
                abort();
            memset(p, 'a' + (int)(i % 26), size);
            KEEP(p);
            blocks[i] = p;
            sizes[i] = size;
        }
        for (long i = 0; i < per_wave; i++) {
            if (keep_every && i % keep_every == keep_every - 1)
                cache_put(blocks[i], sizes[i]);
            else
                free(blocks[i]);
        }
    }
    free(sizes);
    free(blocks);
    return NULL;
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {
        {"threads", &threads, NULL},   {"waves", &waves, NULL},
        {"per-wave", &per_wave, NULL}, {"min", &min_size, NULL},
        {"max", &max_size, NULL},      {"keep-every", &keep_every, NULL},
        {"trim", &trim, NULL},
    };
    hs_parse(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]));
    if (threads < 1 || threads > 1024 || per_wave < 1 || min_size < 1 || max_size < min_size) {
        fprintf(stderr, "%s: need 1 <= --threads <= 1024, --per-wave >= 1, "
                        "1 <= --min <= --max\n", argv[0]);
        return 2;
    }
    long long rss_start = rss_statm();
    pthread_t *tids = malloc((size_t)threads * sizeof *tids);
    if (!tids)
        abort();
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    double t0 = hs_now();
    for (long t = 0; t < threads; t++)
        if (pthread_create(&tids[t], NULL, worker, (void *)(uintptr_t)(t + 1)) != 0) {
            fprintf(stderr, "%s: pthread_create failed\n", argv[0]);
            return 1;
        }
    for (long t = 0; t < threads; t++)
        pthread_join(tids[t], NULL);
    double t1 = hs_now();
    long long rss_after = rss_statm();
    long long rss_trim = rss_after;
    double t2 = t1;
    if (trim) {
        malloc_trim(0);
        t2 = hs_now();
        rss_trim = rss_statm();
    }
    lab_json_begin();
    lab_json_str("event", "result");
    lab_json_str("allocator", lab_allocator());
    lab_json_num("threads", threads);
    lab_json_num("waves", waves);
    lab_json_num("per_wave", per_wave);
    lab_json_num("min", min_size);
    lab_json_num("max", max_size);
    lab_json_num("keep_every", keep_every);
    lab_json_num("trim", trim);
    lab_json_num("kept_blocks", (long long)cache_len);
    lab_json_num("kept_bytes", cache_bytes);
    lab_json_num("rss_start", rss_start);
    lab_json_num("rss_after", rss_after);
    lab_json_num("rss_trim", rss_trim);
    lab_json_real("work_s", t1 - t0);
    lab_json_real("trim_s", t2 - t1);
    lab_json_end();
    free(tids);
    return 0;
}
