/* hs-alloc-errors: every allocation entry point at sizes that cannot be served, and at
 * alignments that are no alignment. Each must fail as POSIX says (NULL and errno ENOMEM or
 * EINVAL; posix_memalign returns the error) and none may hand out a block. Prints one
 * line per failed check and "alloc-errors: failed=N"; exit 1 when N > 0. */
#include <malloc.h>
#include <stdint.h>
#include <unistd.h>

#include "scenario.h"

static int failed;

static void want_null(const char *what, void *p, int err, int want_err)
{
    if (p != NULL || err != want_err) {
        printf("FAIL %s: got %p errno %d, want NULL errno %d\n", what, p, err, want_err);
        failed++;
    }
}

#define CHECK_NULL(call, want_err)                \
    do {                                          \
        errno = 0;                                \
        void *p_ = (call);                        \
        want_null(#call, p_, errno, (want_err));  \
    } while (0)

int main(void)
{
    static volatile size_t opaque = SIZE_MAX - 100; /* unknown to the compiler: no folding */
    const size_t huge = opaque;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    CHECK_NULL(malloc(huge), ENOMEM);
    CHECK_NULL(calloc(huge / 2, 4), ENOMEM);
    CHECK_NULL(realloc(NULL, huge), ENOMEM);
    CHECK_NULL(reallocarray(NULL, huge / 2, 4), ENOMEM);
    CHECK_NULL(pvalloc(huge), ENOMEM);
    CHECK_NULL(valloc(huge), ENOMEM);
    CHECK_NULL(memalign(64, huge), ENOMEM);
    CHECK_NULL(aligned_alloc(64, huge), ENOMEM);
    void *p = (void *)1;
    int rc = posix_memalign(&p, 64, huge);
    if (rc != ENOMEM) {
        printf("FAIL posix_memalign(&p, 64, huge): got %d, want ENOMEM\n", rc);
        failed++;
    }
    rc = posix_memalign(&p, 24, 16);
    if (rc != EINVAL) {
        printf("FAIL posix_memalign(&p, 24, 16): got %d, want EINVAL\n", rc);
        failed++;
    }
    /* and the small cases still work: page aligned, whole pages */
    void *q = pvalloc(0);
    if (!q || (uintptr_t)q % page) {
        printf("FAIL pvalloc(0): got %p, want a page-aligned block\n", q);
        failed++;
    }
    free(q);
    q = pvalloc(page + 1);
    if (!q || (uintptr_t)q % page || malloc_usable_size(q) < 2 * page) {
        printf("FAIL pvalloc(page + 1): got %p, want two pages\n", q);
        failed++;
    }
    free(q);
    printf("alloc-errors: failed=%d\n", failed);
    return failed != 0;
}
