/* hs-idle: holds a little memory and sleeps; used to measure the sampler's own cost.
 * Truth: bytes live for ms milliseconds, then freed. */
#include "scenario.h"

int main(int argc, char **argv)
{
    long ms = 2000, mb = 1;
    const struct hs_opt opts[] = {{"ms", &ms, NULL}, {"mb", &mb, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);

    size_t n = (size_t)(mb * MIB);
    void *p = malloc(n);
    if (!p && n)
        abort();
    memset(p, 0x5a, n);
    KEEP(p);
    hs_sleep_ms(ms);
    free(p);
    printf("idle: ms=%ld bytes=%ld\n", ms, mb * MIB);
    return 0;
}
