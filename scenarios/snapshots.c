/* hs-snapshots: asks heapsight for snapshots at known moments through the C API
 * (include/heapsight_snapshot.h); runs the same without heapsight.
 * Truth: "loaded" holds mb MiB live, "freed" holds 1 MiB (one block in 64 kept). */
#include "scenario.h"
#include "heapsight_snapshot.h"

int main(int argc, char **argv) {
  long mb = 64;
  const struct hs_opt opts[] = {{"mb", &mb, NULL}};
  hs_parse(argc, argv, opts, sizeof opts / sizeof opts[0]);
  long n = mb * 1024; /* 1 KiB blocks */
  char **p = malloc(n * sizeof *p);
  for (long i = 0; i < n; i++) {
    p[i] = malloc(1024);
    memset(p[i], 1, 1024);
    KEEP(p[i]);
  }
  int a = HEAPSIGHT_SNAPSHOT("loaded");
  for (long i = 0; i < n; i++)
    if (i % 64) free(p[i]);
  int b = HEAPSIGHT_SNAPSHOT("freed");
  printf("snapshots: taken=%d\n", a + b);
  return 0;
}
