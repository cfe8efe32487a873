/* options.c: the HEAPSIGHT_* environment variables the library reads, in one table.
 * Booleans accept 1/true/yes/on and 0/false/no/off (HEAPSIGHT_RELEASE_AT_EXIT also
 * "copy"); anything else warns and keeps the default. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "hs_options.h"

hs_options_t _hs_opt = {.release_at_exit = -1, .reach = 1, .reach_index = 1, .sample_bytes = 524288};

static void warn(const char *name, const char *val, const char *want) {
  char buf[256];
  int n = snprintf(buf, sizeof buf, "heapsight: ignoring %s=%s (expected %s)\n", name, val, want);
  if (n > 0) (void)!write(2, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void read_bool(const char *name, int *out) {
  const char *v = getenv(name);
  if (!v) return;
  if (!strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on")) *out = 1;
  else if (!strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off")) *out = 0;
  else warn(name, v, "1/true/yes/on or 0/false/no/off");
}

static void read_double(const char *name, double *out, double lo, double hi) {
  const char *v = getenv(name);
  if (!v) return;
  char *end;
  double d = strtod(v, &end);
  if (end == v || *end || d < lo || d > hi) warn(name, v, "a number in range");
  else *out = d;
}

/* 0, or a whole number of bytes in [lo, hi]. */
static void read_bytes(const char *name, uint64_t *out, uint64_t lo, uint64_t hi) {
  const char *v = getenv(name);
  if (!v) return;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (*v < '0' || *v > '9' || *end || errno == ERANGE || (n != 0 && (n < lo || n > hi)))
    warn(name, v, "0 (off) or a number of bytes from 64 to 2^40");
  else *out = n;
}

/* Read when the segment is attached (the first allocation may come before the
 * constructor that reads the rest). */
void _hs_options_read_sampling(void) {
  read_bytes("HEAPSIGHT_SAMPLE_BYTES", &_hs_opt.sample_bytes, 64, 1ull << 40);
}

/* Read when the allocator is known (allocators.c): whether the hooks keep the record of
 * block starts the marking needs under another allocator than glibc. */
int _hs_options_read_reach(void) {
  read_bool("HEAPSIGHT_REACH", &_hs_opt.reach);
  return _hs_opt.reach;
}

void _hs_options_read(void) {
  read_bool("HEAPSIGHT_REACH", &_hs_opt.reach);
  read_bool("HEAPSIGHT_REACH_INDEX", &_hs_opt.reach_index);
  read_bool("HEAPSIGHT_MAPS_WHILE_RUNNING", &_hs_opt.maps_while_running);
  const char *w = getenv("HEAPSIGHT_REACH_WORKERS");
  if (w && (!strcmp(w, "1") || !strcmp(w, "2"))) _hs_opt.reach_workers = *w - '0';
  else if (w && strcasecmp(w, "auto")) warn("HEAPSIGHT_REACH_WORKERS", w, "auto, 1 or 2");
  /* glibc.malloc.hugetlb makes systrim give back whole huge pages: not counted */
  const char *t = getenv("GLIBC_TUNABLES");
  const char *hp = t ? strstr(t, "glibc.malloc.hugetlb=") : NULL;
  _hs_opt.huge_pages = hp && hp[21] && hp[21] != '0' && hp[21] != ':';
  const char *m = getenv("HEAPSIGHT_MAP_RELEASE");
  if (m) {
    static const char *const names[] = {"auto", "run", "count", "check"};
    int found = -1;
    for (int i = 0; i < 4; i++) if (!strcasecmp(m, names[i])) found = i;
    if (found < 0) warn("HEAPSIGHT_MAP_RELEASE", m, "auto, run, count or check");
    else _hs_opt.map_release = found;
  }
  const char *v = getenv("HEAPSIGHT_RELEASE_AT_EXIT");
  if (v && !strcasecmp(v, "copy")) _hs_opt.release_at_exit = HS_RELEASE_IN_COPY;
  else read_bool("HEAPSIGHT_RELEASE_AT_EXIT", &_hs_opt.release_at_exit);
}
