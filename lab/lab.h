/* Shared by the heapsight lab programs (C11 and C++17), header-only.
 *
 * Each lab program measures itself the way the write-ups did: VmSize and VmRSS from
 * /proc/self/status, read with open/read into a stack buffer (fopen would allocate and pin
 * the heap top), and the allocator's own statistics. It prints one JSON object per line
 * on stdout; heapsight lab parses those lines and ignores everything else. */
#ifndef HS_LAB_H
#define HS_LAB_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../scenarios/scenario.h"

#ifdef __cplusplus
extern "C" {
#endif

/* VmSize and VmRSS of this process in bytes (0 when /proc is unreadable). */
typedef struct {
    long long vm;
    long long rss;
} lab_mem_t;

static inline long long lab_status_field(const char *buf, const char *key)
{
    const char *p = strstr(buf, key);
    if (!p)
        return 0;
    p += strlen(key);
    while (*p == ' ' || *p == '\t')
        p++;
    return atoll(p) * 1024LL; /* the kernel prints kB */
}

static inline lab_mem_t lab_mem(void)
{
    char buf[4096];
    lab_mem_t m = {0, 0};
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return m;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return m;
    buf[n] = 0;
    m.vm = lab_status_field(buf, "VmSize:");
    m.rss = lab_status_field(buf, "VmRSS:");
    return m;
}

/* Which allocator answers malloc in this process: each exports a function glibc lacks. */
static inline const char *lab_allocator(void)
{
    if (dlsym(RTLD_DEFAULT, "mallctl"))
        return "jemalloc";
    if (dlsym(RTLD_DEFAULT, "MallocExtension_GetNumericProperty"))
        return "tcmalloc";
    if (dlsym(RTLD_DEFAULT, "mi_version"))
        return "mimalloc";
    if (dlsym(RTLD_DEFAULT, "heapsight_mmap_live_bytes"))
        return "mmap";
    return "glibc";
}

/* glibc's mallinfo2, or all zeros under another allocator (which may not define it). */
static inline struct mallinfo2 lab_mallinfo2(void)
{
    struct mallinfo2 mi;
    memset(&mi, 0, sizeof mi);
    if (strcmp(lab_allocator(), "glibc") == 0)
        mi = mallinfo2();
    return mi;
}

#ifdef __cplusplus
typedef bool lab_bool;
#else
typedef _Bool lab_bool;
#endif

/* The allocator's "give free memory back now": malloc_trim(0), jemalloc's purge of all
 * arenas, tcmalloc's ReleaseFreeMemory, mimalloc's mi_collect(true). Returns 1 if called. */
static inline int lab_release(void)
{
    const char *a = lab_allocator();
    if (strcmp(a, "glibc") == 0) {
        malloc_trim(0);
        return 1;
    }
    if (strcmp(a, "jemalloc") == 0) {
        int (*mallctl)(const char *, void *, size_t *, void *, size_t) =
            (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
        return mallctl && mallctl("arena.4096.purge", NULL, NULL, NULL, 0) == 0;
    }
    if (strcmp(a, "tcmalloc") == 0) {
        void (*rel)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory");
        if (rel)
            rel();
        return rel != NULL;
    }
    if (strcmp(a, "mimalloc") == 0) {
        void (*col)(lab_bool) = (void (*)(lab_bool))dlsym(RTLD_DEFAULT, "mi_collect");
        if (col)
            col(1);
        return col != NULL;
    }
    return 0;
}

/* Prints `"key": value` pairs: lab_json_begin(), lab_json_num/str()..., lab_json_end(). */
static int lab_json_first_;
static inline void lab_json_begin(void)
{
    fputc('{', stdout);
    lab_json_first_ = 1;
}
static inline void lab_json_key_(const char *k)
{
    printf("%s\"%s\": ", lab_json_first_ ? "" : ", ", k);
    lab_json_first_ = 0;
}
static inline void lab_json_num(const char *k, long long v)
{
    lab_json_key_(k);
    printf("%lld", v);
}
static inline void lab_json_real(const char *k, double v)
{
    lab_json_key_(k);
    printf("%.6g", v);
}
static inline void lab_json_str(const char *k, const char *v)
{
    lab_json_key_(k);
    printf("\"%s\"", v); /* callers pass plain identifiers only */
}
static inline void lab_json_end(void)
{
    fputs("}\n", stdout);
    fflush(stdout);
}

#ifdef __cplusplus
}
#endif
#endif
