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

/* A file of /proc/self into buf, NUL-ended (size - 1 bytes at most): its length, 0 when it
 * could not be read. */
size_t _hs_proc_self_read(const char *path, char *buf, size_t size) {
  int fd = hs_open(path, O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  return (size_t)n;
}

/* VmRSS and RssAnon, in bytes, as the kernel gives them. 1 when read. */
int _hs_status_read(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  char buf[4096];
  if (!_hs_proc_self_read("/proc/self/status", buf, sizeof buf)) return 0;
  *rss_bytes = field_kb(buf, "\nVmRSS:") * 1024;
  *anon_bytes = field_kb(buf, "\nRssAnon:") * 1024;
  return 1;
}

/* RSS and anonymous RSS from /proc/self/statm (its resident and shared pages: the same
 * kernel counters as status's VmRSS and RssFile + RssShmem, a fifth of its text to make
 * and parse). 1 when read. */
int _hs_statm_read(uint64_t *rss_bytes, uint64_t *anon_bytes) {
  char buf[256];
  if (!_hs_proc_self_read("/proc/self/statm", buf, sizeof buf)) return 0;
  uint64_t v[3] = {0, 0, 0};
  const char *p = buf;
  for (int i = 0; i < 3; i++) {
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return 0;
    while (*p >= '0' && *p <= '9') v[i] = v[i] * 10 + (uint64_t)(*p++ - '0');
  }
  long page = sysconf(_SC_PAGESIZE);
  if (page <= 0 || v[1] == 0) return 0;
  *rss_bytes = v[1] * (uint64_t)page;
  *anon_bytes = (v[1] > v[2] ? v[1] - v[2] : 0) * (uint64_t)page;
  return 1;
}
