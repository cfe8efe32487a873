/* procself.c: the clock and the process's own memory from /proc/self/status (open/read
 * into a stack buffer: fopen would allocate). Shared by the preload library and the copy's
 * library (copylib.c). */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "hs_fd.h"
#include "hs_internal.h"

uint64_t _hs_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t field_kb(const char *buf, const char *key) {
  const char *p = strstr(buf, key);
  if (!p) return 0;
  p += strlen(key);
  while (*p == ' ' || *p == '\t') p++;
  uint64_t v = 0;
  while (*p >= '0' && *p <= '9') v = v * 10 + (uint64_t)(*p++ - '0');
  return v;
}

/* VmRSS and RssAnon, in bytes, as the kernel gives them. 1 when read. */
int _hs_status_read(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  char buf[4096];
  int fd = hs_open("/proc/self/status", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  *rss_bytes = field_kb(buf, "\nVmRSS:") * 1024;
  *anon_bytes = field_kb(buf, "\nRssAnon:") * 1024;
  return 1;
}
