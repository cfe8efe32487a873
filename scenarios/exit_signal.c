/* hs-exit-signal: a signal handler calls exit() while the main thread is busy in malloc
 * and free (most of its time is inside the allocator, under its arena lock). exit() runs
 * the exit handlers, heapsight's release probe among them, on this same thread: nothing
 * there may wait for the lock the interrupted malloc holds. Prints "exit-signal: exiting"
 * from the handler (write, which is async-signal-safe) and exits 0. */
#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include "scenario.h"

static long after_ms = 30;

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "exit-signal: exiting\n";
    (void)!write(1, msg, sizeof msg - 1);
    exit(0); /* not async-signal-safe, and programs do it anyway */
}

int main(int argc, char **argv)
{
    const struct hs_opt opts[] = {{"after-ms", &after_ms, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    void *keep = malloc(MIB); /* something live at exit */
    memset(keep, 1, MIB);
    KEEP(keep);
    signal(SIGALRM, on_alarm);
    struct itimerval t = {{0, 0}, {after_ms / 1000, (after_ms % 1000) * 1000}};
    setitimer(ITIMER_REAL, &t, NULL);
    uint64_t seed = 88172645463325252ull;
    void *held[64] = {0};
    for (;;) { /* sizes above the tcache's, so each call takes the arena lock */
        unsigned i = (unsigned)(hs_rand(&seed) % 64);
        free(held[i]);
        held[i] = malloc(hs_rand_range(&seed, 2048, 200000));
        KEEP(held[i]);
    }
}
