/* hs-die: the process dies abnormally (SIGKILL, SIGSEGV, abort, _exit) holding memory,
 * so no exit handlers run. Truth: live_bytes = mb MiB at death; exit 137/139/134/3. */
#include <signal.h>
#include <unistd.h>

#include "scenario.h"

int main(int argc, char **argv)
{
    const char *how = "kill";
    long mb = 20;
    const struct hs_opt opts[] = {{"how", NULL, &how}, {"mb", &mb, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
    if (strcmp(how, "kill") && strcmp(how, "segv") && strcmp(how, "abort") && strcmp(how, "_exit")) {
        fprintf(stderr, "%s: --how must be kill, segv, abort or _exit\n", argv[0]);
        return 2;
    }

    for (long i = 0; i < mb; i++) {
        void *p = malloc(MIB);
        if (!p)
            abort();
        memset(p, 0x5a, MIB);
        KEEP(p);
    }
    hs_sleep_ms(100);
    printf("die: how=%s live_bytes=%ld\n", how, mb * MIB);
    fflush(stdout); /* stdio buffers are lost on every path below */

    if (strcmp(how, "kill") == 0)
        raise(SIGKILL);
    else if (strcmp(how, "segv") == 0)
        raise(SIGSEGV); /* default action, same as a real crash */
    else if (strcmp(how, "abort") == 0)
        abort();
    else
        _exit(3);
    return 1; /* not reached */
}
