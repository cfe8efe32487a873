// hs-new-handler: operator new, nothrow and throwing, when malloc fails and a new_handler
// frees a reserve: the standard says the handler runs and the allocation is retried. The
// address space is capped (RLIMIT_AS, 32 MiB above what is mapped) so a 64 MiB block fits
// only once the 64 MiB reserve is gone. Prints "new-handler: handler_calls=2 nothrow_ok=1
// throwing_ok=1 null_ok=1 kept_bytes=N" and exits 0 when all hold; the nothrow block stays.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "scenario.h"

static void *reserve;
static int handler_calls;

static void release_reserve()
{
    handler_calls++;
    if (!reserve) {
        std::set_new_handler(nullptr); // nothing left to give: the next failure is final
        return;
    }
    free(reserve);
    reserve = nullptr;
}

static long vm_bytes()
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

static bool cap_address_space(long headroom)
{
    struct rlimit r = {(rlim_t)(vm_bytes() + headroom), RLIM_INFINITY};
    return setrlimit(RLIMIT_AS, &r) == 0;
}

int main()
{
    const size_t block = 64 * MIB;
    // nothrow: the reserve is given back by the handler, the retry succeeds
    reserve = malloc(block);
    if (!reserve || !cap_address_space(block / 2)) {
        perror("setup");
        return 2;
    }
    std::set_new_handler(release_reserve);
    char *a = new (std::nothrow) char[block];
    int nothrow_ok = a != nullptr && handler_calls == 1;
    if (a)
        memset(a, 0x5a, block);
    KEEP(a);
    // throwing, same again: raise the cap by what `a` holds and take a new reserve
    struct rlimit r = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_AS, &r);
    reserve = malloc(block);
    int throwing_ok = 0;
    if (reserve && cap_address_space(block / 2)) {
        std::set_new_handler(release_reserve);
        try {
            char *b = new char[block];
            memset(b, 0x5a, block);
            throwing_ok = handler_calls == 2;
            delete[] b;
        } catch (const std::bad_alloc &) {
        }
    }
    // and with no handler left, nothrow gives NULL instead of throwing
    std::set_new_handler(nullptr);
    char *c = new (std::nothrow) char[4 * block];
    int null_ok = c == nullptr;
    setrlimit(RLIMIT_AS, &r); // the exit (and whatever runs there) gets its address space back
    printf("new-handler: handler_calls=%d nothrow_ok=%d throwing_ok=%d null_ok=%d kept_bytes=%zu\n",
           handler_calls, nothrow_ok, throwing_ok, null_ok, block);
    return nothrow_ok && throwing_ok && null_ok ? 0 : 1;
}
