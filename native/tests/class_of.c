/* class_of.c: prints hs_class_of(size) for each size given on the command line, one per
 * line, so the test suite checks the Python names of the classes (segment.class_floor_bytes)
 * against the C function the counters use. */
#include <stdio.h>
#include <stdlib.h>

#include "hs_internal.h"

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) printf("%u\n", hs_class_of((size_t)strtoull(argv[i], NULL, 0)));
  return 0;
}
