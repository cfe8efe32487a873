/* hs-static: statically linked, so LD_PRELOAD cannot interpose malloc at all.
 * Truth: live_bytes = 10 MiB (64 KiB blocks) held for 200 ms; the tool must say it saw nothing. */
#include "scenario.h"

int main(int argc, char **argv)
{
    long mb = 10, hold_ms = 200;
    const struct hs_opt opts[] = {{"mb", &mb, NULL}, {"hold-ms", &hold_ms, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);

    for (long done = 0; done < mb * MIB; done += 64 * 1024) {
        void *p = malloc(64 * 1024);
        if (!p)
            abort();
        memset(p, 0x5a, 64 * 1024);
        KEEP(p);
    }
    hs_sleep_ms(hold_ms);
    printf("static: live_bytes=%ld\n", mb * MIB);
    return 0;
}
