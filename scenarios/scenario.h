/* Tiny helpers shared by the heapsight scenario programs (C11 and C++17).
 * Header-only: option parsing, a sleep, a deterministic PRNG and KEEP(). */
#ifndef HS_SCENARIO_H
#define HS_SCENARIO_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* gcc -O2 deletes malloc/free pairs and memsets whose results are never read;
 * passing the pointer to an empty asm with a memory clobber forbids that. */
#define KEEP(p) __asm__ volatile("" ::"r"(p) : "memory")

#define MIB (1024L * 1024L)

/* One `--name value` option: either numeric (num) or string (str). */
struct hs_opt {
    const char *name;
    long *num;
    const char **str;
};

static inline void hs_usage_exit(const char *prog, const char *msg, const char *arg,
                                 const struct hs_opt *opts, int nopts)
{
    fprintf(stderr, "%s: %s: %s\nknown options:", prog, msg, arg);
    for (int j = 0; j < nopts; j++)
        fprintf(stderr, " --%s", opts[j].name);
    fprintf(stderr, "%s\n", nopts ? "" : " (none)");
    exit(2);
}

/* Parses `--name value` pairs into opts (defaults are whatever the variables
 * already hold). Unknown option, missing or malformed value: stderr + exit 2. */
static inline void hs_parse(int argc, char **argv, const struct hs_opt *opts, int nopts)
{
    for (int i = 1; i < argc; i++) {
        const struct hs_opt *o = NULL;
        if (strncmp(argv[i], "--", 2) == 0)
            for (int j = 0; j < nopts; j++)
                if (strcmp(argv[i] + 2, opts[j].name) == 0)
                    o = &opts[j];
        if (!o)
            hs_usage_exit(argv[0], "unknown option", argv[i], opts, nopts);
        if (i + 1 >= argc)
            hs_usage_exit(argv[0], "missing value for", argv[i], opts, nopts);
        const char *v = argv[++i];
        if (o->str) {
            *o->str = v;
        } else {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 0)
                hs_usage_exit(argv[0], "bad value", v, opts, nopts);
            *o->num = n;
        }
    }
}

static inline void hs_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline double hs_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* xorshift64: deterministic, state must be non-zero. */
static inline uint64_t hs_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Uniform-ish integer in [lo, hi]. */
static inline size_t hs_rand_range(uint64_t *s, size_t lo, size_t hi)
{
    return lo + (size_t)(hs_rand(s) % (hi - lo + 1));
}

#endif
