/* segment.c: maps the stats segment the CLI created (HEAPSIGHT_SEGMENT=path). The first
 * process to attach owns it; its forked children and other descendants count privately,
 * so no child's figures are ever mixed into the parent's. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hs_fd.h"
#include "hs_internal.h"

hs_segment_t *_hs_seg;
static size_t g_len;          /* bytes mapped: with or without the profile's tables */
static dev_t g_dev;           /* the attached file, for the fork child to find it again */
static ino_t g_ino;
static int g_owner;

/* The sizes a segment file may have: with the profile's tables (sampling on; the size
 * says their room, heapsight.h), or without them when the run samples nothing. */
static int valid_size(uint64_t n) { return n == HS_SEGMENT_BASE_BYTES || hs_profile_room(n) != 0; }

int _hs_is_owner(void) { return g_owner; }

/* Counters for a process that owns no segment: it never samples, so no profile tables. */
static hs_segment_t *private_segment(void) {
  void *p = mmap(NULL, HS_SEGMENT_BASE_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  g_len = HS_SEGMENT_BASE_BYTES;
  return (hs_segment_t *)p;
}

/* which image attached: after an execve into one that does not load us, the CLI sees that
 * the program's executable is no longer this one */
static void image_of(hs_segment_t *s) {
  char exe[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe);
  if (n > 0) {
    size_t keep = (size_t)n < sizeof s->image - 1 ? (size_t)n : sizeof s->image - 1;
    memcpy(s->image, exe + (size_t)n - keep, keep);
    s->image[keep] = 0;
  }
}

/* shared 0: a private segment, which only this process reads (the hooks count into it; no
 * CLI maps it): what costs system calls at every start of the run's other processes (the
 * RSS at start, whose malloc, the image) is left out. */
static void fill_header(hs_segment_t *s, int shared) {
  s->version = HS_SEGMENT_VERSION;
  s->size_bytes = g_len;
  s->slot_bytes = sizeof(hs_slot_t);
  s->max_slots = HS_MAX_SLOTS;
  s->n_classes = HS_CLASSES;
  s->slots_offset = offsetof(hs_segment_t, slots);
  s->mapped_at = (uint64_t)(uintptr_t)s;
  s->start_ns = _hs_now_ns();
  s->usable_by_header = (uint64_t)_hs_usable_by_header;
  _hs_allocator_describe(s, shared);
  if (shared) {
    _hs_read_status(&s->start_rss_bytes, &s->start_anon_bytes);
    image_of(s);
  }
  __atomic_store_n(&s->state, HS_STATE_RUNNING, __ATOMIC_RELEASE);
  __atomic_store_n(&s->magic, HS_SEGMENT_MAGIC, __ATOMIC_RELEASE);
}

/* The segment's bytes resident in this process: its pages present in our page tables
 * (/proc/self/pagemap, bit 63), read a page of entries at a time into the stack. The
 * figures the library reads from /proc/self/status leave them out. */
uint64_t _hs_segment_resident(void) {
  hs_segment_t *seg = _hs_seg;
  long page = sysconf(_SC_PAGESIZE);
  if (!seg || page <= 0) return 0;
  int fd = hs_open("/proc/self/pagemap", O_RDONLY, 0);
  if (fd < 0) return 0;
  uint64_t entries[512], present = 0, first = (uint64_t)(uintptr_t)seg / (uint64_t)page;
  for (uint64_t at = 0, n = g_len / (uint64_t)page; at < n;) {
    uint64_t want = n - at < 512 ? n - at : 512;
    ssize_t got = pread(fd, entries, want * 8, (off_t)((first + at) * 8));
    if (got <= 0) break;
    for (ssize_t i = 0; i < got / 8; i++) present += entries[i] >> 63;
    at += (uint64_t)got / 8;
  }
  close(fd);
  return present * (uint64_t)page;
}

/* The helper thread forks only for heap maps (heapmap.c): those children are not the
 * program's. */
static void on_fork_parent(void) {
  if (g_owner && !_hs_t_helper) __atomic_fetch_add(&_hs_seg->forks, 1, __ATOMIC_RELAXED);
}

/* The attached path: the file itself (O_NOFOLLOW, same device and inode), or -1. */
static char g_path[4096];
static int reopen_attached(void) {
  int fd = hs_open(g_path, O_RDONLY | O_NOFOLLOW, 0);
  struct stat st;
  if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_dev != g_dev || st.st_ino != g_ino ||
                  (uint64_t)st.st_size < g_len)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

/* The child must stop writing to the shared pages at once, keeping every pointer into
 * them valid: the same file mapped privately over the same address (copy-on-write). No
 * descriptor is kept open in the program (it could be one the program closed and reuses,
 * closefrom() for one), so the file is opened again here, and taken only if it is the very
 * file attached. If it is gone (removed at the run's end, replaced), the counters seen so
 * far are copied into a private anonymous mapping instead. */
void _hs_segment_after_fork_child(void) {
  if (!g_owner) return;
  g_owner = 0;
  int fd = reopen_attached();
  void *p = MAP_FAILED;
  if (fd >= 0) {
    p = mmap(_hs_seg, g_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    close(fd);
  }
  if (p != MAP_FAILED) return;
  /* the header and the slots in use (the profile is the parent's; the child never samples) */
  size_t used = _hs_seg->slots_used < HS_MAX_SLOTS ? (size_t)_hs_seg->slots_used + 1 : HS_MAX_SLOTS;
  size_t keep = offsetof(hs_segment_t, slots) + used * sizeof(hs_slot_t);
  void *copy = mmap(NULL, keep, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy != MAP_FAILED) memcpy(copy, _hs_seg, keep);
  mmap(_hs_seg, g_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_ANONYMOUS, -1, 0);
  if (copy != MAP_FAILED) {
    memcpy(_hs_seg, copy, keep);
    munmap(copy, keep);
  }
}

/* Opens HEAPSIGHT_SEGMENT only if it is a segment heapsight made for a run that is still
 * going: a regular file (not a symlink: O_NOFOLLOW) of our user with no group or other
 * access, of the exact size, whose header says "made by the CLI" or "attached" (by us
 * before an execve, or by a parent), whose creator (the heapsight process) is alive, and
 * whose run is not over. Anything else is left untouched and the program runs uncounted. So a variable that
 * leaks into a daemon outliving the run finds no live creator (or no file) and writes
 * nothing, and a path naming any other file never has a byte written into it. */
/* The header's fields before `owners`, read or written through a small buffer: the
 * whole segment type is 3 MB, too big for a stack (a program may run with 1 MiB). */
#define HS_HEAD_BYTES offsetof(hs_segment_t, owners)
#define HEAD_GET(buf, field) head_get((buf), offsetof(hs_segment_t, field))
#define HEAD_SET(buf, field, v) head_set((buf), offsetof(hs_segment_t, field), (v))
static uint64_t head_get(const unsigned char *b, size_t off) {
  uint64_t v;
  memcpy(&v, b + off, sizeof v);
  return v;
}
static void head_set(unsigned char *b, size_t off, uint64_t v) { memcpy(b + off, &v, sizeof v); }

static int open_segment(const char *path, struct stat *out) {
  int fd = hs_open(path, O_RDWR | O_NOFOLLOW, 0);
  if (fd < 0) return -1;
  struct stat st;
  unsigned char head[HS_HEAD_BYTES];
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      (st.st_mode & 077) != 0 || !valid_size((uint64_t)st.st_size) ||
      pread(fd, head, sizeof head, 0) != (ssize_t)sizeof head)
    goto refuse;
  if (HEAD_GET(head, version) != HS_SEGMENT_VERSION ||
      HEAD_GET(head, size_bytes) != (uint64_t)st.st_size)
    goto refuse;
  /* attached already: by us before an execve, or by another process (then we only count
   * ourselves as a foreign attach); a finished run is never reopened */
  uint64_t magic = HEAD_GET(head, magic), creator = HEAD_GET(head, creator_pid);
  if (magic == HS_SEGMENT_MAGIC) {
    if (HEAD_GET(head, state) == HS_STATE_DONE) goto refuse;
  } else if (magic != HS_SEGMENT_CREATED) {
    goto refuse;
  }
  if (creator == 0 || (kill((pid_t)creator, 0) != 0 && errno != EPERM))
    goto refuse;
  *out = st;
  return fd;
refuse:
  close(fd);
  return -1;
}

/* HEAPSIGHT_SEGMENT=auto (what `heapsight env` prints for a service started without
 * heapsight run): the process makes its own segment, /dev/shm/heapsight-PID-auto.seg, as
 * the CLI would (0600, exact size, creation magic, itself as creator), for `heapsight
 * attach PID` to read; it is removed at exit. */
static char g_own_path[96];

/* The attached segment's path (g_path above): heap maps are written beside it. */

const char *_hs_segment_path(void) { return g_owner && g_path[0] ? g_path : NULL; }

static const char *make_own_segment(char *buf, size_t len) {
  int n = snprintf(buf, len, "/dev/shm/heapsight-%d-auto.seg", (int)getpid());
  if (n <= 0 || (size_t)n >= len) return NULL;
  int fd = hs_open(buf, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    /* made by this very process before an execve (a launcher such as valgrind's, which
     * loads the library too, then execs the tool that runs the program): open_segment
     * takes it only if it is one of ours, made by this pid and not finished */
    memcpy(g_own_path, buf, (size_t)n + 1);
    return buf;
  }
  if (fd < 0) return NULL;
  unsigned char head[HS_HEAD_BYTES];
  memset(head, 0, sizeof head);
  HEAD_SET(head, magic, HS_SEGMENT_CREATED);
  HEAD_SET(head, version, HS_SEGMENT_VERSION);
  HEAD_SET(head, size_bytes, hs_segment_bytes(HS_PROFILE_ROOM_DEFAULT));
  HEAD_SET(head, creator_pid, (uint64_t)getpid());
  /* its pages reserved now: a tmpfs that runs out later would be SIGBUS at a write */
  int ok = fchmod(fd, 0600) == 0 && posix_fallocate(fd, 0, (off_t)hs_segment_bytes(HS_PROFILE_ROOM_DEFAULT)) == 0 &&
           pwrite(fd, head, sizeof head, 0) == (ssize_t)sizeof head;
  close(fd);
  if (!ok) {
    unlink(buf);
    return NULL;
  }
  memcpy(g_own_path, buf, (size_t)n + 1);
  return buf;
}

int _hs_segment_is_own(void) { return g_own_path[0] && _hs_is_owner(); }

void _hs_segment_remove_own(void) {
  if (_hs_segment_is_own()) unlink(g_own_path);
}

/* Whether an image's name (basename) is `name`, or `name` followed by a version: python3
 * matches python3.11, perl matches perl5.36.0. */
static int name_is(const char *base, const char *name, size_t n) {
  if (n == 0 || strncmp(base, name, n) != 0) return 0;
  for (const char *p = base + n; *p; p++) {
    if (!(*p == '.' || (*p >= '0' && *p <= '9'))) return 0;
  }
  return 1;
}

/* Whether this process's first argument is `arg` (/proc/self/cmdline: its words, each
 * ending in a NUL). */
static int first_argument_is(const char *arg) {
  char buf[512];
  int fd = hs_open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  size_t first = strlen(buf) + 1; /* past argv[0] */
  return first < (size_t)n && strcmp(buf + first, arg) == 0;
}

/* Whether this process may own the run's segment (its figures are the run's): when
 * HEAPSIGHT_FOLLOW names a program, only a process of it may (by its executable's name,
 * symlinks resolved, or the name it was started by: comm), and when it names a program and
 * a word ("git pack-objects": a child with the command's own name), only one whose first
 * argument is that word; else the first to attach. */
static int may_own(void) {
  const char *given = getenv("HEAPSIGHT_FOLLOW");
  if (!given || !*given) return 1;
  char follow[256];
  size_t given_len = strlen(given);
  if (given_len >= sizeof follow) return 0;
  memcpy(follow, given, given_len + 1);
  char *word = strchr(follow, ' ');
  if (word) {
    *word++ = 0;
    if (!first_argument_is(word)) return 0;
  }
  char exe[4096], comm[32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  const char *base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  comm[0] = 0;
  int fd = hs_open("/proc/self/comm", O_RDONLY | O_CLOEXEC, 0);
  if (fd >= 0) {
    ssize_t k = read(fd, comm, sizeof comm - 1);
    close(fd);
    comm[k > 0 ? k : 0] = 0;
    char *nl = strchr(comm, '\n');
    if (nl) *nl = 0;
  }
  size_t len = strlen(follow);
  return name_is(base, follow, len) || name_is(comm, follow, len);
}

void _hs_segment_attach(void) {
  if (_hs_seg) return;
  pthread_atfork(NULL, on_fork_parent, _hs_segment_after_fork_child);
  const char *path = _hs_attach_segment ? _hs_attach_segment : getenv("HEAPSIGHT_SEGMENT");
  hs_segment_t *seg = NULL;
  uint64_t creator = 0;
  char own[96];
  if (path && strcmp(path, "auto") == 0) path = make_own_segment(own, sizeof own);
  if (path && *path) {
    struct stat st;
    int fd = open_segment(path, &st);
    if (fd >= 0) {
      /* mapped, the file needs no descriptor: none of ours stays open in the program */
      void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p != MAP_FAILED) {
        seg = (hs_segment_t *)p;
        g_len = (size_t)st.st_size;
        g_dev = st.st_dev;
        g_ino = st.st_ino;
      }
    }
    if (seg) {
      creator = seg->creator_pid;
      uint64_t me = (uint64_t)getpid(), none = 0;
      int may = may_own();
      if (!may) none = __atomic_load_n(&seg->owner_pid, __ATOMIC_ACQUIRE);
      if (may && __atomic_compare_exchange_n(&seg->owner_pid, &none, me, 0, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE)) {
        g_owner = 1;
      } else if (none == me) {
        /* execve in the owner: the old image and its heap are gone, start over. */
        uint64_t execs = seg->execs + 1, forks = seg->forks, foreign = seg->foreign_attaches;
        /* the CLI's heap-map requests stand across the execve */
        uint64_t map_seq = seg->heapmap_seq, map_ack = seg->heapmap_ack,
                 map_at_exit = seg->heapmap_at_exit;
        /* the header and the slots used: the others are still zero, and writing them
         * would make them resident in the program */
        uint64_t used = seg->slots_used < HS_MAX_SLOTS ? seg->slots_used + 1 : HS_MAX_SLOTS;
        memset(seg, 0, offsetof(hs_segment_t, slots) + (size_t)used * sizeof(hs_slot_t));
        if (hs_profile_room(g_len)) _hs_profile_reset(seg);
        seg->owner_pid = me;
        seg->execs = execs;
        seg->forks = forks;
        seg->foreign_attaches = foreign;
        seg->heapmap_seq = map_seq;
        seg->heapmap_ack = map_ack;
        seg->heapmap_at_exit = map_at_exit;
        g_owner = 1;
      } else {
        __atomic_fetch_add(&seg->foreign_attaches, 1, __ATOMIC_RELAXED);
        munmap(seg, g_len);
        seg = NULL;
      }
    }
    if (seg) {
      size_t n = strlen(path);
      if (n < sizeof g_path) memcpy(g_path, path, n + 1);
    }
  }
  int shared = seg != NULL;
  if (!seg) seg = private_segment();
  if (!seg) return; /* no memory for counters at all: run uncounted */
  fill_header(seg, shared);
  seg->creator_pid = creator;
  _hs_seg = seg;
}

/* heapsight attach --track, at dlclose (attach.c): the segment unmapped, the file left for
 * the CLI, which made it and reads it. */
void _hs_segment_unmap(void) {
  hs_segment_t *seg = _hs_seg;
  if (!seg || g_len == 0) return;
  _hs_seg = NULL;
  munmap(seg, g_len);
}
