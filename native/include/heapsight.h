/* heapsight.h: the stats segment, the one contract between libheapsight.so (writer) and
 * the CLI (reader: src/heapsight/layout.py mirrors this layout field by field, and the
 * compiler checks each field and constant it mirrors: tests/test_native.py).
 * Fields are little-endian 64-bit integers unless declared otherwise (an event's stack and
 * kind are 32-bit, the kind packing the sampling level; a stack word packs HS_IFRAME_*);
 * byte arrays are NUL padded. Bump HS_SEGMENT_VERSION whenever a field moves. */
#ifndef HEAPSIGHT_H
#define HEAPSIGHT_H

#include <stddef.h>
#include <stdint.h>

#define HS_SEGMENT_MAGIC 0x3147455354485348ull   /* "HSHTSEG1": attached by its owner */
#define HS_SEGMENT_CREATED 0x3157454e54485348ull /* "HSHTNEW1": made by the CLI, not yet attached */
#define HS_SEGMENT_VERSION 26
#define HS_MAX_SLOTS 256      /* slot 0 is shared (atomic updates); threads own slots 1..255 */
#define HS_FINE_CLASSES 64    /* usable sizes below 1024 bytes: one class per 16 bytes */
#define HS_SUBCLASSES 8       /* above 1024 bytes: 8 classes per power of two */
#define HS_CLASSES (HS_FINE_CLASSES + (64 - 10) * HS_SUBCLASSES)
/* Per-thread slack before the global live figure and its peak are updated: 64 KiB while
 * few threads count, less as more do, so all threads together never hold back more than
 * HS_FLUSH_TOTAL_BYTES (or HS_FLUSH_MIN_BYTES per thread past 256 threads). */
#define HS_FLUSH_BYTES (64 * 1024)
#define HS_FLUSH_MIN_BYTES (4 * 1024)
#define HS_FLUSH_TOTAL_BYTES (1024 * 1024)
/* How long a heap map's copy may take before it ends itself (heapmap.c), and how long the
 * allocator's calls at exit may take (probe.c): the CLI waits a little longer than these
 * (src/heapsight/layout.py mirrors them). */
#define HS_MAP_LIMIT_S 30
#define HS_PROBE_LIMIT_S 30

/* Allocator identities (hs_segment_t.allocator_id). */
enum { HS_ALLOC_UNKNOWN = 0, HS_ALLOC_GLIBC = 1, HS_ALLOC_JEMALLOC = 2,
       HS_ALLOC_TCMALLOC = 3, HS_ALLOC_MIMALLOC = 4, HS_ALLOC_MMAP = 5 };

/* How the program's exit began (hs_segment_t.exit_begun_how), as the library saw it: 3 at
 * a flush of its counters once CPython's _PyRuntime._finalizing is set (the CLI's ticks
 * also read that word from outside, py_finalizing_addr). */
enum { HS_EXIT_BEGUN_NONE = 0, HS_EXIT_BEGUN_MAIN_RETURNED = 1, HS_EXIT_BEGUN_EXIT_CALLED = 2,
       HS_EXIT_BEGUN_PY_FINALIZING = 3 };

/* Segment states (hs_segment_t.state). */
enum { HS_STATE_EMPTY = 0, HS_STATE_RUNNING = 1, HS_STATE_EXITING = 2, HS_STATE_DONE = 3 };

/* How the exit probe went (hs_segment_t.exit_probe_status, set with state DONE). Only
 * DONE means the exit figures and the release were measured; otherwise exit_stats_before
 * holds the last sampled figures (their time_ns says when), if any. */
enum {
  HS_PROBE_NOT_RUN = 0,          /* no exit handlers ran (yet) */
  HS_PROBE_DONE = 1,
  HS_PROBE_ALLOCATOR_LOCKED = 2, /* the allocator's lock stayed taken: exit() was called
                                    while a malloc held it (a signal handler, or a thread
                                    stuck inside the allocator) */
  HS_PROBE_TIMED_OUT = 3,        /* the allocator's calls ran past 30 s */
  HS_PROBE_NO_HELPER = 4,        /* the library's thread could not start: not measured */
  HS_PROBE_SECCOMP = 5           /* the program installed a seccomp filter: no system call,
                                    no copy at exit (the filter may forbid them) */
};

/* The allocator's own view of its heap, whichever allocator it is. Bytes unless named. */
#define HS_STATS_UNKNOWN UINT64_MAX
typedef struct hs_alloc_stats_s {
  uint64_t time_ns;          /* CLOCK_MONOTONIC when taken */
  uint64_t in_use_bytes;     /* handed out to the program, as the allocator counts it */
  uint64_t free_bytes;       /* free but held by the allocator (not necessarily resident) */
  uint64_t mapped_bytes;     /* obtained from the OS: sbrk + heaps + mmapped chunks */
  uint64_t resident_bytes;   /* allocator's own resident figure, 0 when it has none */
  uint64_t mmapped_bytes;    /* in separately mmapped chunks */
  uint64_t arenas;           /* arena count (glibc: <heap nr=...> in malloc_info) */
  uint64_t top_pad_bytes;    /* releasable top of the main heap (glibc keepcost) */
  uint64_t raw[10];          /* allocator-specific: glibc mallinfo2 fields in order */
  /* in_use_bytes and free_bytes are HS_STATS_UNKNOWN where they would need a walk of the
   * allocator's free lists (glibc: read without its locks, they are not known) */
} hs_alloc_stats_t;

/* What a block adds to the countdowns beyond its usable bytes: glibc's size word, so that
 * the hot path counts a heap chunk's size as it reads it from the header. */
#define HS_BLOCK_EXTRA 8

/* One thread's counters. Only its owner writes them (no locks); readers sum all slots.
 * The hot path writes the first line: the counts of allocations and frees, the requested
 * bytes, and two countdowns (bytes allocated and freed until the slow path runs: the next
 * flush of the live figure, or the next sample). It adds no usable bytes: a countdown
 * counts each block's usable + HS_BLOCK_EXTRA bytes, and when the owner sets a countdown
 * again it first folds what it counted into alloc_chunk_bytes (free_chunk_bytes), between
 * two steps of seq. The usable bytes are then hs_slot_usable's sums. Everything else is
 * written on the slow path (counters.c). */
typedef struct hs_slot_s {
  int64_t left;              /* bytes this thread may allocate before the slow path: the
                                least of the flush limit and sample_left, as of left_base */
  int64_t free_left;         /* bytes it may free before it flushes, as of free_base */
  uint64_t alloc_chunk_bytes; /* usable + HS_BLOCK_EXTRA bytes of the allocations counted
                                before left_base was set */
  uint64_t free_chunk_bytes; /* the same of the frees, before free_base was set */
  uint64_t n_alloc;
  uint64_t n_free;
  uint64_t req_alloc_bytes;  /* requested bytes of every allocation (waste: usable - this) */
  uint64_t n_realloc;
  /* second line: the slow path's */
  uint64_t claimed;          /* 1 while a live thread owns it */
  uint64_t tid;              /* last owner */
  int64_t left_base;         /* left as set at the last flush or sample */
  int64_t sample_left;       /* usable bytes until the next sampled allocation (profile.c),
                                as of left_base and n_alloc_base */
  int64_t flushed_net;       /* usable bytes allocated less freed at the last flush */
  uint64_t n_large;          /* heap blocks of 128 KiB usable or more (not mmapped chunks):
                                glibc's mmap threshold had risen past them */
  uint64_t n_mmapped;        /* glibc: allocations served by their own mmap */
  uint64_t mmapped_alloc_bytes; /* glibc: the chunk sizes of those, */
  uint64_t mmapped_free_bytes;  /* and of the ones freed (live: the difference) */
  int64_t free_base;         /* free_left as set at the last flush */
  uint64_t n_alloc_base;     /* n_alloc when left_base was set */
  uint64_t seq;              /* odd while the owner folds a countdown in (a seqlock) */
  uint64_t pad[4];
} hs_slot_t;

/* The poke: to have every thread of the program enter the slow path at its next
 * allocation and free (where it takes a heap map the CLI asked for, probe.c's
 * _hs_map_poll), the CLI takes HS_POKE off each slot's two countdowns with an atomic
 * compare-and-swap (hs_poke_slots), once until the owner takes it off; an owner's store may
 * overwrite it, and the CLI then pokes again. A countdown's real span is far below
 * HS_POKE / 2, so the bytes counted since its base are the difference taken modulo HS_POKE
 * (hs_counted); the owner's refill, which adds (base - what it read), takes the pokes it
 * read off again. */
#define HS_POKE (1ll << 60)
static inline int64_t hs_counted(int64_t base, int64_t left) {
  uint64_t d = (uint64_t)base - (uint64_t)left, half = (uint64_t)HS_POKE / 2;
  return (int64_t)((d + half) & ((uint64_t)HS_POKE - 1)) - (int64_t)half;
}

/* A slot's usable bytes allocated and freed, as of one moment. A reader in another thread
 * or process reads the fields again while the owner is folding a countdown in (seq odd,
 * or moved), and while the hot path moved a count between its reads of the count and of
 * its countdown (they are written apart, with no seq: a reader preempted between them
 * read the countdown some thousand blocks behind the count, 8 bytes off each, 12 KiB in
 * all); it never waits on the owner: past `tries` reads it returns 0 with what it read
 * last (a thread stopped in the middle of a fold: the caller may have better). */
static inline int hs_slot_usable(const hs_slot_t *s, int tries, uint64_t *alloc,
                                 uint64_t *freed) {
  for (int i = 0;; i++) {
    uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    uint64_t na = __atomic_load_n(&s->n_alloc, __ATOMIC_ACQUIRE);
    uint64_t a = __atomic_load_n(&s->alloc_chunk_bytes, __ATOMIC_RELAXED) +
                 (uint64_t)hs_counted(__atomic_load_n(&s->left_base, __ATOMIC_RELAXED),
                                      __atomic_load_n(&s->left, __ATOMIC_RELAXED)) -
                 HS_BLOCK_EXTRA * na;
    uint64_t nf = __atomic_load_n(&s->n_free, __ATOMIC_ACQUIRE);
    uint64_t f = __atomic_load_n(&s->free_chunk_bytes, __ATOMIC_RELAXED) +
                 (uint64_t)hs_counted(__atomic_load_n(&s->free_base, __ATOMIC_RELAXED),
                                      __atomic_load_n(&s->free_left, __ATOMIC_RELAXED)) -
                 HS_BLOCK_EXTRA * nf;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    int ok = q % 2 == 0 && __atomic_load_n(&s->seq, __ATOMIC_RELAXED) == q &&
             __atomic_load_n(&s->n_alloc, __ATOMIC_RELAXED) == na &&
             __atomic_load_n(&s->n_free, __ATOMIC_RELAXED) == nf;
    if (ok || i >= tries) {
      *alloc = a;
      *freed = f;
      return ok;
    }
  }
}

/* The size histogram, from the sampled allocations (profile.c, under its lock): per
 * usable-size class, each sampled block weighted by the inverse of the probability it had
 * to be sampled (Horvitz-Thompson: the sums are unbiased estimates of the whole heap's).
 * Doubles, read racily (each an aligned 8-byte word some moment had). */
typedef struct hs_hist_s {
  double alloc_w[HS_CLASSES];  /* allocations, estimated */
  double live_w[HS_CLASSES];   /* blocks live now, estimated */
  double waste_w[HS_CLASSES];  /* (usable - requested) of the allocations, estimated */
  double live_u_w[HS_CLASSES]; /* usable bytes of the blocks live now, estimated */
  double live_var[HS_CLASSES]; /* the variance of live_w: sum of v = (1 - p) / p^2 */
  double live_var_u[HS_CLASSES], live_var_uu[HS_CLASSES]; /* sums of v * usable, v * usable^2:
                                  the live waste share's variance (a ratio estimate) */
  uint64_t live_samples;       /* sampled blocks live now (0: the estimates fall back) */
} hs_hist_t;

/* Sampled call sites (native/src/profile.c writes, src/heapsight/profile.py reads).
 * Allocations are sampled by bytes (a Poisson process of mean mean_bytes over usable bytes),
 * each sampled block an ALLOC event with its stack; its free, if any, a FREE event naming
 * the ALLOC event's index. Events are claimed with events_used (atomic) and published by
 * storing kind last (release): a reader skips events whose kind is still EMPTY. Stacks are
 * deduplicated: word[o] = frame count n, word[o+1..o+n] = return addresses, innermost first
 * (the hooks' own frames left out; subtract 1 to land inside the call; at most
 * HS_MAX_FRAMES, the outermost cut); offset 0 is the empty stack (not unwound). Modules
 * are appended when a stack first reaches an address outside the known ones, before the
 * event whose stack needs them. A FREE event is only written for a recorded ALLOC, and room
 * for it is kept: every ALLOC's free, if it comes, is recorded. */
#define HS_PROFILE_MAGIC 0x31464f5250534853ull /* "HSSPROF1": set up by the library */
/* The tables follow the profile's header page, sized by the segment file itself: a profile
 * of room k holds k units of HS_PROFILE_*_UNIT (events, stack words, modules), so its file
 * is offsetof(hs_segment_t, profile) + HS_PROFILE_TABLES + k * HS_PROFILE_UNIT_BYTES bytes
 * (hs_profile_room reads k back). The file's pages are reserved in /dev/shm for the run and
 * its mapping counts against the program's address-space limit: heapsight makes room 8
 * (262,144 events: 131,072 sampled blocks with their frees, 64 GiB allocated at the default
 * mean; 13 MiB of tables), or room 1 (1.6 MiB) for a program with an address-space limit or
 * a small /dev/shm. Past the room, samples are dropped and counted (dropped_samples). */
#define HS_PROFILE_TABLES 4096u
#define HS_PROFILE_EVENTS_UNIT (1u << 15)
#define HS_PROFILE_WORDS_UNIT (1u << 16)
#define HS_PROFILE_MODULES_UNIT 512u
#define HS_PROFILE_ROOM_DEFAULT 8u
#define HS_PROFILE_ROOM_MAX 16u
#define HS_MAX_FRAMES 64
/* An interpreter's frame in a stored stack (Python's function, file and line): the word
 * HS_IFRAME_TAG | kind << 56 | o, o the word offset of its record in the stack region:
 * word[o] = HS_IFRAME_MAGIC, word[o+1..o+3] = what identifies it in the program (code
 * object, name, file: addresses), word[o+4] = line (bits 0-31) | name bytes (32-47) | file
 * bytes (48-63), then the name's UTF-8 bytes and the file's, padded to whole words. A
 * record is written once per (code, line), before any stack names it. */
#define HS_IFRAME_TAG (1ull << 63)
#define HS_IFRAME_MAGIC 0x454d415246534823ull /* "#HSFRAME" */
#define HS_IFRAME_KIND_SHIFT 56
#define HS_IFRAME_OFFSET_MASK ((1ull << HS_IFRAME_KIND_SHIFT) - 1)
#define HS_IFRAME_NAME_SHIFT 32 /* word[o+4]: the name's bytes from this bit, */
#define HS_IFRAME_FILE_SHIFT 48 /* the file's from this one */
/* Which interpreter (the IFRAME word's kind, the profile's interp_kind) and why its frames
 * were not read (interp_status). */
enum { HS_INTERP_NONE = 0, HS_INTERP_PYTHON = 1, HS_INTERP_PERL = 2 };
enum { HS_INTERP_STATUS_OK = 0, HS_INTERP_STATUS_VERSION = 1, HS_INTERP_STATUS_SYMBOLS = 2,
       HS_INTERP_STATUS_READS = 3, HS_INTERP_STATUS_OFF = 4 };
/* MAP: an anonymous private mmap (or brk) the program made itself, outside malloc (every
 * one, not sampled: they are few); its munmap is a FREE naming it like an ALLOC's. */
enum { HS_EVENT_EMPTY = 0, HS_EVENT_ALLOC = 1, HS_EVENT_FREE = 2, HS_EVENT_MAP = 3 };
#define HS_EVENT_KIND_MASK 0xffu  /* an event's kind: HS_EVENT_* in these bits, */
#define HS_EVENT_LEVEL_SHIFT 8    /* an ALLOC's sampling level in the byte from this bit */

typedef struct hs_event_s {
  uint64_t addr;             /* ALLOC, MAP: the block; FREE: index of the event it ends */
  uint64_t size;             /* ALLOC: usable bytes; MAP: bytes mapped; FREE: 0 */
  uint64_t time_ns;          /* CLOCK_MONOTONIC */
  uint32_t stack;            /* ALLOC, MAP: word offset of its stack; FREE: 0 */
  uint32_t kind;             /* HS_EVENT_* in bits 0-7; an ALLOC's sampling level in bits
                                8-15 (signed: drawn at mean M / 2^level); stored last
                                (HS_EVENT_KIND_MASK, HS_EVENT_LEVEL_SHIFT) */
} hs_event_t;

typedef struct hs_module_s {
  uint64_t lo, hi;           /* the addresses its loaded segments span */
  uint64_t bias;             /* load bias: address in the file = address - bias */
  uint64_t first_event;      /* events_used when recorded: it applies from that event on */
  char path[224];            /* its file (the last 223 bytes); the executable's real path */
} hs_module_t;

typedef struct hs_profile_s {
  uint64_t magic;
  uint64_t mean_bytes;       /* sampling mean; 0: off */
  uint64_t events_used;      /* claimed (past the room: dropped, counted below) */
  uint64_t stack_words_used;
  uint64_t modules_used;
  uint64_t dropped_samples;  /* samples not recorded: a region was full */
  uint64_t unwind_ns, unwinds, unwind_frames; /* what unwinding cost, in all */
  /* The interpreter's frames (native/src/interp.c): which interpreter (1 Python, 2 Perl; 0
   * none seen), whether its frames are read (0) or why not (1 a version not known, 2 its
   * symbols not found, 3 reads of this process refused, 4 turned off:
   * HEAPSIGHT_INTERP_FRAMES=0), its version (Python: Py_Version),
   * and what reading them cost, in all (walks: samples that read them; frames read). */
  uint64_t interp_kind, interp_status, interp_version;
  uint64_t interp_ns, interp_walks, interp_frames;
  /* stacks walked from the unwind rules cached per return address (unwind.c; the others:
   * libgcc's), and with HEAPSIGHT_UNWIND_CHECK=1 those walked by libgcc too and how many of
   * them came out different (a test keeps this 0) */
  uint64_t unwind_cached, unwind_checked, unwind_mismatches;
  /* the tables, from HS_PROFILE_TABLES: hs_profile_events, _words, _modules below */
} hs_profile_t;

#define HS_MAX_OWNERS 16
typedef struct hs_owner_s {
  uint64_t base;             /* the object's load address (dladdr), 0 for a free entry */
  int64_t mapped_bytes;      /* mapped now: mmap - munmap (+ mremap growth) by its code */
  uint64_t peak_bytes;
  uint64_t mappings;         /* mmap calls */
  char name[96];             /* its file (the last 95 bytes) */
} hs_owner_t;

typedef struct hs_segment_s {
  uint64_t magic, version, size_bytes, slot_bytes, max_slots, n_classes;
  uint64_t owner_pid;        /* the process whose figures these are (first to attach) */
  uint64_t state;
  uint64_t execs;            /* times the owner re-attached after execve */
  uint64_t forks;            /* children forked by the owner (their figures are not here) */
  uint64_t foreign_attaches; /* other processes (descendants) that found the segment taken */
  uint64_t slots_used;       /* high-water mark of slot indices */
  uint64_t slot_overflows;   /* thread starts that found every slot taken */
  uint64_t start_ns;         /* CLOCK_MONOTONIC at attach */
  uint64_t start_rss_bytes, start_anon_bytes; /* /proc/self/status at attach */
  int64_t live_usable_bytes; /* global figure, updated every flush limit per thread */
  uint64_t peak_usable_bytes;
  uint64_t peak_ns;
  uint64_t allocator_id;
  char allocator_name[32];
  char allocator_version[32]; /* as the allocator gives it ("": it gives none) */
  /* The object whose malloc the program's calls reach when it is not heapsight's (its last
   * 127 bytes): an executable that carries an allocator of its own and exports malloc
   * (Chromium's PartitionAlloc, a binary linked with tcmalloc) comes before every preloaded
   * library, and its calls never pass through the hooks. "": heapsight's is reached. */
  char malloc_elsewhere[128];
  uint64_t usable_by_header; /* 1: glibc chunk header read directly; 0: malloc_usable_size */
  uint64_t helper_mallocs;   /* allocations made by the exit thread (probe.c): must stay 0 */
  /* The release probe at exit (state DONE once written). */
  uint64_t exit_ns, release_ns;
  uint64_t exit_rss_before, exit_rss_after, exit_anon_before, exit_anon_after;
  uint64_t exit_release_kind; /* what was called, as HS_ALLOC_* of the allocator */
  hs_alloc_stats_t exit_stats_before, exit_stats_after;
  uint64_t slots_offset;      /* byte offset of slots[0], for readers */
  uint64_t creator_pid;       /* the heapsight process that made it: attach only while it lives */
  char image[128];            /* the executable that attached (its last 127 bytes, NUL ended) */
  uint64_t exit_probe_status; /* HS_PROBE_*: whether the exit figures were measured, or why not */
  uint64_t library_threads;   /* threads the library runs in the program (its helper): 0 or 1;
                               * 1 only for an allocator whose calls may block (not glibc) or
                               * when the CLI asks for heap maps while the program runs */
  uint64_t library_cpu_ns;    /* CPU time of the library's own work: its helper thread, and the
                               * exiting thread during the exit probe (not the program's) */
  /* heapsight_snapshot(label): the program asks for a snapshot; the CLI takes it and
   * answers by setting snapshot_ack to snapshot_seq (include/heapsight_snapshot.h) */
  uint64_t snapshot_seq, snapshot_ack;
  char snapshot_label[64];
  /* Heap maps (heapmap.c): the CLI asks for map N by setting heapmap_seq to N; the library
   * writes "<segment path>.map.N" and sets heapmap_ack to N. At exit it writes
   * "<segment path>.map.exit" before the release, when heapmap_at_exit is 1. */
  uint64_t heapmap_seq, heapmap_ack, heapmap_at_exit;
  uint64_t mapped_at;         /* the owner's address of this mapping: the CLI reads which of
                                 its pages are resident in the program (/proc/PID/pagemap) */
  uint64_t heapmap_exit_pid;  /* the exit map's copy, which the program does not wait for: the
                                 CLI waits for its file, or for it to end */
  uint64_t heapmap_copy_pid;  /* the last copy made, a snapshot's or the exit's: the CLI
                                 makes no new one while it runs, whoever's child it is */
  uint64_t exit_done_ns;      /* when the exit probe let the program go on (CLOCK_MONOTONIC):
                                 less exit_ns, what heapsight held the program at exit */
  uint64_t slot_claims;       /* counter slots claimed in all: the threads that allocated */
  uint64_t own_private_bytes; /* heapsight's own private memory written in the program (the
                                 sampled blocks' tables and byte map, the unwind rules): the
                                 readers leave it out of the program's RSS and anonymous RSS */
  /* glibc's figures are read from outside, by the CLI (/proc/PID/mem), with no thread of
   * heapsight's in the program: main_arena's address (0: not found, or not glibc) and the
   * offsets in a malloc_state of ->next (the ring of arenas) and ->system_mem */
  uint64_t glibc_main_arena, glibc_arena_next_off, glibc_arena_sysmem_off;
  uint64_t threads_seen;      /* the program's threads, as the CLI last read them (/proc): a
                                 thread's first allocation reads this, never /proc itself */
  uint64_t seccomp_at_ns;     /* when the program installed a seccomp filter (0: none seen):
                                 from then on the library makes no system call of its own
                                 in the program's allocations, and no copy at exit */
  /* When the program's exit began (CLOCK_MONOTONIC; 0: not seen), before its exit handlers,
   * static destructors and an interpreter's teardown ran (exit_ns comes after them all),
   * and how (HS_EXIT_BEGUN_*): the first to see it writes both, the owner only */
  uint64_t exit_begun_ns, exit_begun_how;
  /* The library's reading at that moment (main returned, exit() called, or the first flush
   * after CPython began finalizing), written after exit_begun_ns, then exit_begun_read set
   * to 1 (0: none taken): RSS and anonymous RSS as /proc/self/statm gave them, heapsight's
   * own pages in them (0: not read, as under a seccomp filter), heapsight's private bytes
   * then, the slots' sums as the sampler reads them (hs_slot_usable), and what glibc held
   * from the OS then (its arenas' system_mem and the mmapped chunks, read as the sampler
   * reads them, and its arenas; HS_STATS_UNKNOWN and 0 under another allocator or a
   * seccomp filter) */
  uint64_t exit_begun_read, exit_begun_rss, exit_begun_anon, exit_begun_own_private;
  uint64_t exit_begun_usable_alloc, exit_begun_usable_free, exit_begun_req_alloc;
  uint64_t exit_begun_n_alloc, exit_begun_n_free, exit_begun_alloc_mapped, exit_begun_arenas;
  uint64_t py_finalizing_addr; /* CPython: &_PyRuntime._finalizing in the owner (0: not
                                 CPython, or a version not known), non-zero once
                                 Py_FinalizeEx began its teardown: the CLI reads it there */
  /* anonymous memory the program maps itself (mmap outside malloc), by the object that
   * called mmap: a runtime's own heap (CPython's pymalloc arenas, the JVM's, V8's) */
  hs_owner_t owners[HS_MAX_OWNERS];
  hs_hist_t hist;
  hs_slot_t slots[HS_MAX_SLOTS] __attribute__((aligned(64)));
  /* Sampled allocations with their call stacks (profile.c). Left out of the file (its size
   * ends here) when the run samples nothing. */
  hs_profile_t profile __attribute__((aligned(4096)));
  /* then the profile's tables, as many as the file's size says */
} hs_segment_t;

#define HS_PROFILE_UNIT_BYTES                                                               \
  ((uint64_t)HS_PROFILE_EVENTS_UNIT * sizeof(hs_event_t) + (uint64_t)HS_PROFILE_WORDS_UNIT * 8 + \
   (uint64_t)HS_PROFILE_MODULES_UNIT * sizeof(hs_module_t))
/* a segment without the profile (the run samples nothing) ends where the profile starts */
#define HS_SEGMENT_BASE_BYTES ((uint64_t)offsetof(hs_segment_t, profile))

/* The bytes of a segment file with a profile of room k (0: without the profile). */
static inline uint64_t hs_segment_bytes(uint64_t room) {
  return room ? HS_SEGMENT_BASE_BYTES + HS_PROFILE_TABLES + room * HS_PROFILE_UNIT_BYTES
              : HS_SEGMENT_BASE_BYTES;
}

/* The room of a segment file of this size; 0 when it has no profile (or is no segment). */
static inline uint64_t hs_profile_room(uint64_t size_bytes) {
  for (uint64_t k = 1; k <= HS_PROFILE_ROOM_MAX; k++)
    if (hs_segment_bytes(k) == size_bytes) return k;
  return 0;
}

static inline hs_event_t *hs_profile_events(hs_profile_t *p) {
  return (hs_event_t *)(void *)((char *)p + HS_PROFILE_TABLES);
}
static inline uint64_t *hs_profile_words(hs_profile_t *p, uint64_t room) {
  return (uint64_t *)(void *)(hs_profile_events(p) + room * HS_PROFILE_EVENTS_UNIT);
}
static inline hs_module_t *hs_profile_modules(hs_profile_t *p, uint64_t room) {
  return (hs_module_t *)(void *)(hs_profile_words(p, room) + room * HS_PROFILE_WORDS_UNIT);
}

#endif
