/* hs-fork: parent keeps parent_mb live, a child (fork, or fork+exec of itself) allocates
 * child_mb and exits normally. Truth: parent_live_bytes in the parent, child_bytes in the child. */
#include <sys/wait.h>
#include <unistd.h>

#include "scenario.h"

static void alloc_kept(long bytes, long block)
{
    for (long done = 0; done < bytes; done += block) {
        void *p = malloc(block);
        if (!p)
            abort();
        memset(p, 0x5a, block);
        KEEP(p); /* kept live, never freed */
    }
}

/* What the child does in both modes: allocate, linger, exit normally (atexit runs). */
static void child_work(long child_mb)
{
    alloc_kept(child_mb * MIB, 4096);
    hs_sleep_ms(100);
    exit(0);
}

int main(int argc, char **argv)
{
    const char *mode = "fork";
    long parent_mb = 10, child_mb = 100;
    const struct hs_opt opts[] = {
        {"mode", NULL, &mode}, {"parent-mb", &parent_mb, NULL}, {"child-mb", &child_mb, NULL},
    };
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);

    if (strcmp(mode, "child") == 0) /* we were exec'd by the parent below */
        child_work(child_mb);
    if (strcmp(mode, "fork") != 0 && strcmp(mode, "exec") != 0) {
        fprintf(stderr, "%s: --mode must be fork, exec or child\n", argv[0]);
        return 2;
    }

    alloc_kept(parent_mb * MIB, 64 * 1024);
    fflush(stdout); /* nothing buffered may be duplicated into the child */
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 1;
    }
    if (pid == 0) {
        if (strcmp(mode, "fork") == 0)
            child_work(child_mb);
        char mbuf[32];
        snprintf(mbuf, sizeof mbuf, "%ld", child_mb);
        execl("/proc/self/exe", argv[0], "--mode", "child", "--child-mb", mbuf, (char *)NULL);
        perror("execl");
        _exit(127);
    }

    int status = 0;
    if (waitpid(pid, &status, 0) < 0) {
        perror("waitpid");
        return 1;
    }
    hs_sleep_ms(100);
    printf("fork: parent_live_bytes=%ld child_bytes=%ld child_pid=%ld\n", parent_mb * MIB,
           child_mb * MIB, (long)pid);
    /* Parent returns without freeing; report a failed child via the exit code. */
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
