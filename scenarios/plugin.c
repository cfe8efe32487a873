/* libhs_plugin.so, loaded by hs-dlopen: its constructor keeps 1 MiB and plugin_make()
 * hands out memset blocks. Allocation sites live in a library that is later dlclose'd. */
#include "scenario.h"

__attribute__((constructor)) static void plugin_init(void)
{
    void *p = malloc(MIB);
    if (!p)
        abort();
    memset(p, 0x5a, MIB);
    KEEP(p); /* kept forever, even after dlclose */
}

/* Explicit visibility in case the build sets -fvisibility=hidden. */
__attribute__((visibility("default"))) void *plugin_make(size_t n)
{
    void *p = malloc(n);
    if (!p)
        abort();
    memset(p, 0x5a, n);
    KEEP(p);
    return p;
}
