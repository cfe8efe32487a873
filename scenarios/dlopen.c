/* hs-dlopen: memory allocated by a dlopen'd plugin outlives its dlclose.
 * Truth: plugin_live_bytes = 1 MiB (plugin constructor) + 4 MiB (one plugin_make kept).
 * --deepbind 1 loads it with RTLD_DEEPBIND (the plugin's own dependencies, libc among them,
 * come before the global scope), and --small N has it hand out N more 64-byte blocks that
 * this program frees: blocks made in the plugin and freed out here. */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <unistd.h>

#include "scenario.h"

int main(int argc, char **argv)
{
    const char *plugin = NULL;
    long deepbind = 0, small = 0;
    const struct hs_opt opts[] = {
        {"plugin", NULL, &plugin}, {"deepbind", &deepbind, NULL}, {"small", &small, NULL}};
    hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);

    char path[PATH_MAX];
    if (!plugin) { /* default: libhs_plugin.so next to this executable */
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n < 0) {
            perror("readlink /proc/self/exe");
            return 1;
        }
        exe[n] = '\0';
        snprintf(path, sizeof path, "%s/libhs_plugin.so", dirname(exe));
        plugin = path;
    }

    void *h = dlopen(plugin, RTLD_NOW | (deepbind ? RTLD_DEEPBIND : 0));
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    void *(*make)(size_t) = (void *(*)(size_t))dlsym(h, "plugin_make");
    if (!make) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    for (long i = 0; i < small; i++)
        free(make(64));
    void *a = make(4 * MIB);
    void *b = make(4 * MIB);
    KEEP(a);
    free(b);
    dlclose(h); /* `a` and the constructor's 1 MiB stay allocated */
    printf("dlopen: plugin_live_bytes=%ld\n", 5 * MIB);
    return 0;
}
