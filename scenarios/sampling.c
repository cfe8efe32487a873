/* hs-sampling: allocations whose sampling can be checked against the truth.
 * --threads T threads each allocate --blocks N blocks from three known functions
 * (sampling_small: 64 B, sampling_mid: 4000 B, sampling_big: 200 KiB, which glibc maps on
 * its own; one in 64 big, 3 in 8 mid, the rest small), all live together. Each thread goes
 * on past its first block once all have one, so all hold a counting slot at once (past 255
 * threads they share the library's slot 0). The threads end, then main frees every other
 * block. Before it frees anything it prints its truth line; after, it writes every block
 * as (address, usable bytes, freed) to --out (raw uint64 triples, with write(2): nothing is
 * allocated once blocks are freed, so no later block takes a freed one's address).
 * --fork 1: a child is forked after the threads; it frees every block of its copy and
 * allocates --blocks blocks of 7000 B from sampling_in_child, then exits; the parent frees
 * nothing. --small 1: every block is a small one. --exec 1: after the threads, the program
 * execs itself (--exec 2), which allocates --blocks blocks of 3000 B from
 * sampling_after_exec. Its functions are exported (CMakeLists.txt) so that the tests can
 * name the frames of the installed program. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

static long nthreads = 4, nblocks = 20000, do_fork = 0, do_exec = 0, only_small = 0;
static const char *out_path = "";

struct block { uint64_t addr, usable, freed; };
static struct block *blocks;
static pthread_barrier_t started; /* every thread has allocated once before any goes on */

__attribute__((noinline)) void *sampling_small(void) { void *p = malloc(64); KEEP(p); return p; }
__attribute__((noinline)) void *sampling_mid(void) { void *p = malloc(4000); KEEP(p); return p; }
__attribute__((noinline)) void *sampling_big(void) { void *p = malloc(200 * 1024); KEEP(p); return p; }

void *worker(void *arg) /* not static: named in the tests */
{
    long t = (long)arg;
    for (long i = 0; i < nblocks; i++) {
        if (i == 1)
            pthread_barrier_wait(&started); /* all hold a slot (or found none) from here */
        long k = i % 64;
        void *p = only_small ? sampling_small()
                : k == 0 ? sampling_big() : k < 25 ? sampling_mid() : sampling_small();
        if (!p)
            abort();
        struct block *b = &blocks[t * nblocks + i];
        b->addr = (uint64_t)(uintptr_t)p;
        b->usable = malloc_usable_size(p);
    }
    return NULL;
}

__attribute__((noinline)) void *sampling_in_child(void) { void *p = malloc(7000); KEEP(p); return p; }
__attribute__((noinline)) void *sampling_after_exec(void) { void *p = malloc(3000); KEEP(p); return p; }

static void write_blocks(long n)
{
    int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return;
    const char *b = (const char *)blocks;
    size_t left = (size_t)n * sizeof *blocks;
    while (left) {
        ssize_t w = write(fd, b, left);
        if (w <= 0)
            break;
        b += w;
        left -= (size_t)w;
    }
    close(fd);
}

int main(int argc, char **argv)
{
    struct hs_opt opts[] = {{"threads", &nthreads, NULL}, {"blocks", &nblocks, NULL},
                            {"fork", &do_fork, NULL}, {"exec", &do_exec, NULL},
                            {"small", &only_small, NULL}, {"out", NULL, &out_path}};
    hs_parse(argc, argv, opts, 6);
    if (do_exec == 2) {
        for (long i = 0; i < nblocks; i++)
            if (!sampling_after_exec())
                abort();
        printf("sampling: exec=2 blocks=%ld\n", nblocks);
        return 0;
    }
    long n = nthreads * nblocks;
    blocks = calloc((size_t)n, sizeof *blocks);
    pthread_t *tids = calloc((size_t)nthreads, sizeof *tids);
    if (!blocks || !tids || pthread_barrier_init(&started, NULL, (unsigned)nthreads) != 0)
        abort();
    for (long t = 0; t < nthreads; t++)
        if (pthread_create(&tids[t], NULL, worker, (void *)t) != 0)
            abort();
    for (long t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    uint64_t usable = 0;
    for (long i = 0; i < n; i++)
        usable += blocks[i].usable;
    printf("sampling: threads=%ld blocks=%ld usable=%llu\n", nthreads, n, (unsigned long long)usable);
    fflush(stdout);
    if (do_exec == 1) {
        char blocks_arg[32];
        snprintf(blocks_arg, sizeof blocks_arg, "%ld", nblocks);
        execl("/proc/self/exe", argv[0], "--exec", "2", "--blocks", blocks_arg, (char *)NULL);
        abort();
    }
    if (do_fork) {
        pid_t pid = fork();
        if (pid == 0) {
            for (long i = 0; i < n; i++)
                free((void *)(uintptr_t)blocks[i].addr);
            for (long i = 0; i < nblocks; i++)
                if (!sampling_in_child())
                    abort();
            _exit(0);
        }
        int st;
        waitpid(pid, &st, 0);
        if (*out_path)
            write_blocks(n);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    for (long i = 0; i < n; i += 2) {
        free((void *)(uintptr_t)blocks[i].addr);
        blocks[i].freed = 1;
    }
    if (*out_path)
        write_blocks(n);
    return 0;
}
