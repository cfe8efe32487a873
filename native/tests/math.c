/* math.c: prints hs_log(x) and hs_expm1_neg(-x) for each x given on the command line, one
 * pair per line (%.17g), so the test suite checks them against libm's. */
#include <stdio.h>
#include <stdlib.h>

#include "hs_math.h"

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    double x = strtod(argv[i], NULL);
    printf("%.17g %.17g\n", hs_log(x), hs_expm1_neg(-x));
  }
  return 0;
}
