/* libhs_free_first.so: its constructor frees a block glibc made directly (__libc_malloc),
 * before anything else allocates through the hooks. */
#include <stdlib.h>

extern void *__libc_malloc(size_t);

__attribute__((constructor)) static void free_first(void)
{
    free(__libc_malloc(32));
    free(NULL);
}

__attribute__((visibility("default"))) void hs_free_first_ran(void) {}
