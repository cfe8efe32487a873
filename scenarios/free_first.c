/* hs-free-first: the first call that reaches heapsight's hooks is a free, made from a
 * library constructor (libhs_free_first.so runs before the preload library's own) of a
 * block that came from glibc directly. Prints "free-first: ok" when it survives. */
#include <stdio.h>

void hs_free_first_ran(void);

int main(void)
{
    hs_free_first_ran();
    printf("free-first: ok\n");
    return 0;
}
