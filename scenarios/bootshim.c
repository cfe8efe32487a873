/* libhs_bootshim.so: allocates while heapsight's library is still starting up. Preloaded
 * after it (LD_PRELOAD="libheapsight.so:libhs_bootshim.so"), its valloc is an IFUNC, and
 * dlsym runs an IFUNC's resolver: heapsight's start-up, looking up the real valloc, runs
 * this one before it knows the real functions. Here it uses every entry point, reallocs a
 * block (the data must follow), and starts a thread that allocates meanwhile (it must wait
 * or be answered, never start the library a second time). At exit it prints
 * "bootshim: ran=1 realloc_kept=1 aligned_ok=1 calloc_zero=1 thread_ok=1". Linked with
 * -z now so nothing here is bound lazily inside dlsym. */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_ran, g_realloc_kept, g_aligned_ok, g_calloc_zero, g_thread_ok;

static int aligned(const void *p, uintptr_t a) { return p != NULL && (uintptr_t)p % a == 0; }

static void *other_thread(void *arg)
{
    (void)arg;
    void *a = malloc(100), *b = NULL;
    int rc = posix_memalign(&b, 64, 100);
    void *c = aligned_alloc(32, 64);
    long ok = a != NULL && rc == 0 && aligned(b, 64) && aligned(c, 32);
    free(a);
    free(b);
    free(c);
    return (void *)ok;
}

static void *shim_valloc(size_t n) { return memalign(4096, n); }

typedef void *(*valloc_fn)(size_t);

static valloc_fn resolve_valloc(void)
{
    g_ran++;
    static const char text[] = "kept across realloc";
    char *p = malloc(sizeof text);
    if (p)
        memcpy(p, text, sizeof text);
    char *q = realloc(p, 4000);
    g_realloc_kept = q != NULL && memcmp(q, text, sizeof text) == 0;
    void *a = aligned_alloc(64, 64), *m = memalign(256, 10), *pm = NULL;
    int rc = posix_memalign(&pm, 128, 10);
    g_aligned_ok = aligned(a, 64) && aligned(m, 256) && rc == 0 && aligned(pm, 128);
    int *z = calloc(100, sizeof *z);
    g_calloc_zero = z != NULL;
    for (int i = 0; z && i < 100; i++)
        g_calloc_zero &= z[i] == 0;
    free(q);
    free(a);
    free(m);
    free(pm);
    free(z);
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, NULL) == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        void *ok = NULL;
        g_thread_ok = pthread_timedjoin_np(t, &ok, &until) == 0 && ok != NULL;
    }
    return shim_valloc;
}

__attribute__((visibility("default"))) void *valloc(size_t n) __attribute__((ifunc("resolve_valloc")));

__attribute__((destructor)) static void report(void)
{
    char buf[160];
    int n = snprintf(buf, sizeof buf,
                     "bootshim: ran=%d realloc_kept=%d aligned_ok=%d calloc_zero=%d thread_ok=%d\n",
                     g_ran, g_realloc_kept, g_aligned_ok, g_calloc_zero, g_thread_ok);
    if (n > 0)
        (void)!write(2, buf, (size_t)n);
}
