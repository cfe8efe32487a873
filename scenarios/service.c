/* hs-service: a long-running service for `heapsight attach`. Worker threads serve requests
 * (a request every --every-ms each): every request allocates a transient buffer and frees
 * it (handle_transient), puts a 1 KiB entry in a cache of --cache entries that replaces its
 * oldest (cache_put: reachable), and, until --leak-kib KiB in all are lost, loses a 16 KiB
 * request buffer (leak_request: no pointer to it is kept). It prints "leaked B bytes in K
 * blocks" once the leak is complete, and serves on until its standard input ends; then it
 * stops its workers, frees its cache and prints "served N requests". --hold-mib M: it first
 * allocates and writes M MiB in 64 KiB blocks it keeps (a large heap, for bench/attach-pause).
 * Truth: definitely lost = K blocks of 16 KiB; still reachable includes the cache. */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "scenario.h"

#define LEAK_BYTES 16384
#define ENTRY_BYTES 1024

static long every_ms = 1, leak_kib = 8192, cache_n = 4096, n_threads = 3, hold_mib = 0;
static void **held;
static void **cache;
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t cache_next;
static atomic_long leaked_blocks, leaks_done, served;
static atomic_int stopping;

__attribute__((noinline)) static void leak_request(long id)
{
    char *buf = malloc(LEAK_BYTES);
    if (!buf)
        abort();
    memset(buf, 0, LEAK_BYTES);
    snprintf(buf, LEAK_BYTES, "request %ld: buffer never freed", id);
    KEEP(buf);
}

__attribute__((noinline)) static void cache_put(long id)
{
    char *entry = malloc(ENTRY_BYTES);
    if (!entry)
        abort();
    snprintf(entry, ENTRY_BYTES, "cache entry %ld", id);
    pthread_mutex_lock(&cache_lock);
    free(cache[cache_next]);
    cache[cache_next] = entry;
    cache_next = (cache_next + 1) % (size_t)cache_n;
    pthread_mutex_unlock(&cache_lock);
}

__attribute__((noinline)) static void handle_transient(uint64_t *rng)
{
    size_t n = hs_rand_range(rng, 64, 8192);
    char *p = malloc(n);
    if (!p)
        abort();
    memset(p, 1, n);
    KEEP(p);
    free(p);
}

/* A sleep that says so when the system call fails otherwise than by a signal: a tool that
 * stopped the thread in it and did not restart it well shows here. */
static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    int rc;
    while ((rc = nanosleep(&ts, &ts)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
        fprintf(stderr, "hs-service: nanosleep failed: errno %d\n", errno);
        exit(3);
    }
}

static void *worker(void *arg)
{
    uint64_t rng = (uint64_t)(uintptr_t)arg * 7919 + 1;
    while (!atomic_load(&stopping)) {
        long id = atomic_fetch_add(&served, 1);
        handle_transient(&rng);
        cache_put(id);
        long limit = leak_kib * 1024 / LEAK_BYTES;
        if (atomic_load(&leaked_blocks) < limit && atomic_fetch_add(&leaked_blocks, 1) < limit) {
            leak_request(id);
            /* the thread that completes the last leak says so, once (two threads could
             * both read leaked_blocks == limit, one of them before the last leak was made) */
            if (atomic_fetch_add(&leaks_done, 1) + 1 == limit) {
                printf("leaked %ld bytes in %ld blocks\n", limit * LEAK_BYTES, limit);
                fflush(stdout);
            }
        }
        nap(every_ms);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {{"every-ms", &every_ms, NULL}, {"leak-kib", &leak_kib, NULL},
                                  {"cache", &cache_n, NULL}, {"threads", &n_threads, NULL},
                                  {"hold-mib", &hold_mib, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (cache_n < 1 || n_threads < 1 || n_threads > 64) {
        fprintf(stderr, "hs-service: --cache and --threads must be at least 1 (threads at most 64)\n");
        return 2;
    }
    cache = calloc((size_t)cache_n, sizeof *cache);
    size_t n_held = (size_t)hold_mib * 16;
    held = calloc(n_held + 1, sizeof *held);
    for (size_t i = 0; i < n_held; i++) {
        held[i] = malloc(65536);
        if (!held[i])
            abort();
        memset(held[i], 7, 65536);
    }
    pthread_t t[64];
    for (long i = 0; i < n_threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    char buf[256];
    ssize_t got;
    while ((got = read(0, buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR)) {
    }
    if (got < 0) {
        fprintf(stderr, "hs-service: read failed: errno %d\n", errno);
        return 3;
    }
    atomic_store(&stopping, 1);
    for (long i = 0; i < n_threads; i++)
        pthread_join(t[i], NULL);
    for (long i = 0; i < cache_n; i++)
        free(cache[i]);
    free(cache);
    for (size_t i = 0; i < n_held; i++)
        free(held[i]);
    free(held);
    printf("served %ld requests\n", atomic_load(&served));
    return 0;
}
