/* interp.c: the interpreter's own frames at a sampled allocation (CPython 3.11), so a call
 * site names the program's function (build_alpha (script.py:12)) and not the interpreter's
 * (PyByteArray_Resize (python3.11)). profile.c splices them into the native stack where the
 * interpreter's eval loop (_PyEval_EvalFrameDefault) is, innermost first.
 *
 * How it reads: the thread's own state (PyGILState_GetThisThreadState: a read of the
 * thread's TSS key, no lock, no allocation; NULL for a thread Python never saw), then the
 * chain of _PyInterpreterFrame from tstate->cframe->current_frame, following `previous`,
 * at most HS_INTERP_DEPTH frames. The GIL is not taken and nothing in the interpreter is
 * called but that one function: the frames read are the allocating thread's own, which
 * cannot change while it is inside malloc (another thread may run Python meanwhile, as
 * when the allocating thread released the GIL; it does not touch these frames). Every read
 * goes through process_vm_readv on this process, which fails with EFAULT on an address not
 * mapped instead of faulting, and every object is checked for its type as it is reached
 * (a code object's ob_type is &PyCode_Type, a name's &PyUnicode_Type, the line table's
 * &PyBytes_Type, addresses found with dlsym): a stale or torn pointer ends the walk. No
 * malloc, no lock, no signal handler; at most three system calls a frame (the frame, its
 * code object, its line table), strings read only when a (code, line) is first stored.
 *
 * Offsets: CPython 3.11's layouts (Include/internal/pycore_frame.h, cpython/code.h,
 * cpython/pystate.h, cpython/unicodeobject.h at v3.11), used only when the running
 * interpreter's Py_Version says 3.11. Others are not read: the run's summary says so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hs_internal.h"

/* ---- CPython 3.11 (x86-64/aarch64, LP64) ---- */
#define PY311_TSTATE_CFRAME 56         /* PyThreadState.cframe */
#define PY311_CFRAME_CURRENT 8         /* _PyCFrame.current_frame */
#define PY311_TSTATE_DATASTACK 296     /* PyThreadState.datastack_chunk, _top, _limit */
#define PY311_CHUNK_DATA 24            /* _PyStackChunk.data */
#define PY311_FRAME_FUNC 0             /* _PyInterpreterFrame.f_func */
#define PY311_FRAME_CODE 32            /* _PyInterpreterFrame.f_code */
#define PY311_FRAME_PREVIOUS 48        /*   .previous */
#define PY311_FRAME_PREV_INSTR 56      /*   .prev_instr */
#define PY311_FRAME_IS_ENTRY 68        /*   .is_entry (bool) */
#define PY311_FRAME_OWNER 69           /*   .owner (char) */
#define PY311_FRAME_BYTES 72
#define PY311_OWNED_BY_GENERATOR 1
#define PY_OB_TYPE 8                   /* PyObject.ob_type */
#define PY_OB_SIZE 16                  /* PyVarObject.ob_size */
#define PY311_CODE_FIRSTLINENO 72      /* PyCodeObject.co_firstlineno */
#define PY311_CODE_FILENAME 112
#define PY311_CODE_QUALNAME 128
#define PY311_CODE_LINETABLE 136
#define PY311_CODE_FIRSTTRACEABLE 168  /*   ._co_firsttraceable (code units) */
#define PY311_CODE_ADAPTIVE 184        /*   .co_code_adaptive: the instructions */
#define PY_BYTES_SVAL 32               /* PyBytesObject.ob_sval */
#define PY_UNICODE_LENGTH 16           /* PyASCIIObject.length */
#define PY_UNICODE_STATE 32            /*   .state: interned:2 kind:3 compact:1 ascii:1 ready:1 */
#define PY_UNICODE_ASCII_DATA 48       /* sizeof(PyASCIIObject): a compact ASCII string's bytes */
#define PY_UNICODE_UTF8_LENGTH 48      /* PyCompactUnicodeObject.utf8_length */
#define PY_UNICODE_UTF8 56             /*   .utf8 (NULL until asked for) */

static int g_kind;            /* HS_INTERP_* */
static int g_status;          /* HS_INTERP_STATUS_* */
static uint64_t g_version;    /* Py_Version */
static pid_t g_pid;
static uintptr_t g_eval_lo, g_eval_hi;
static uintptr_t g_code_type, g_unicode_type, g_bytes_type;
static void *(*g_this_tstate)(void);

static int rd(void *dst, uintptr_t src, size_t n) {
  if (src < 4096) return 0;
  struct iovec l = {dst, n}, r = {(void *)src, n};
  return syscall(SYS_process_vm_readv, g_pid, &l, 1UL, &r, 1UL, 0UL) == (long)n;
}

/* Two reads in one system call (each costs about 0.8 us, most of it the call itself): how
 * many of the two were read whole (they are read in order: a fault ends the call). */
static int rd2(void *d1, uintptr_t s1, size_t n1, void *d2, uintptr_t s2, size_t n2) {
  if (s1 < 4096) return 0;
  int two = s2 >= 4096;
  struct iovec l[2] = {{d1, n1}, {d2, n2}}, r[2] = {{(void *)s1, n1}, {(void *)s2, n2}};
  long got = syscall(SYS_process_vm_readv, g_pid, l, two ? 2UL : 1UL, r, two ? 2UL : 1UL, 0UL);
  return got < (long)n1 ? 0 : got < (long)(n1 + n2) || !two ? 1 : 2;
}

/* Lines found, by (code object, its line table, instruction offset): a sample's line is
 * mostly one seen before, and the table's read and decoding are then saved. Shared by the
 * threads without a lock: an entry carries a check of its own words, so one torn by two
 * writers is a miss. */
#define HS_LINE_CACHE 1024
typedef struct { uint64_t code, table, addrq, line_check; } hs_line_entry_t;
static hs_line_entry_t g_lines[HS_LINE_CACHE];

static uint32_t line_check(uint64_t code, uint64_t table, uint64_t addrq, uint32_t line) {
  uint64_t x = (code * 0x9e3779b97f4a7c15ull) ^ (table + addrq * 0xff51afd7ed558ccdull) ^ line;
  x ^= x >> 29;
  return (uint32_t)(x * 0xc4ceb9fe1a85ec53ull >> 32) | 1;
}

static hs_line_entry_t *line_slot(uint64_t code, uint64_t addrq) {
  return &g_lines[((code >> 4) ^ (addrq * 0x9e3779b1u)) & (HS_LINE_CACHE - 1)];
}

static int line_cached(uint64_t code, uint64_t table, uint64_t addrq, int *line) {
  hs_line_entry_t *e = line_slot(code, addrq);
  uint64_t c = __atomic_load_n(&e->code, __ATOMIC_RELAXED), t = __atomic_load_n(&e->table, __ATOMIC_RELAXED),
           a = __atomic_load_n(&e->addrq, __ATOMIC_RELAXED), lc = __atomic_load_n(&e->line_check, __ATOMIC_RELAXED);
  if (c != code || t != table || a != addrq || (uint32_t)(lc >> 32) != line_check(c, t, a, (uint32_t)lc))
    return 0;
  *line = (int32_t)(uint32_t)lc;
  return 1;
}

static void line_store(uint64_t code, uint64_t table, uint64_t addrq, int line) {
  hs_line_entry_t *e = line_slot(code, addrq);
  __atomic_store_n(&e->code, code, __ATOMIC_RELAXED);
  __atomic_store_n(&e->table, table, __ATOMIC_RELAXED);
  __atomic_store_n(&e->addrq, addrq, __ATOMIC_RELAXED);
  __atomic_store_n(&e->line_check, (uint64_t)line_check(code, table, addrq, (uint32_t)line) << 32 | (uint32_t)line,
                   __ATOMIC_RELAXED);
}

static uint64_t u64(const unsigned char *b, size_t off) {
  uint64_t v;
  memcpy(&v, b + off, 8);
  return v;
}

static int32_t i32(const unsigned char *b, size_t off) {
  int32_t v;
  memcpy(&v, b + off, 4);
  return v;
}

/* The function's range [lo, hi) from its symbol (dladdr1: st_size). */
static int symbol_range(void *fn, uintptr_t *lo, uintptr_t *hi) {
  Dl_info info;
  const ElfW(Sym) *sym = NULL;
  if (!fn || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || !sym || !sym->st_size) return 0;
  *lo = (uintptr_t)fn;
  *hi = *lo + sym->st_size;
  return 1;
}

void _hs_interp_start(int *kind, int *status, uint64_t *version) {
  g_pid = getpid();
  void *eval = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
  const char *want = getenv("HEAPSIGHT_INTERP_FRAMES");
  if (eval && want && strcmp(want, "0") == 0) {
    g_kind = HS_INTERP_PYTHON;
    g_status = HS_INTERP_STATUS_OFF; /* for a measure of what reading them costs */
  } else if (eval) {
    g_kind = HS_INTERP_PYTHON;
    const uint32_t *ver = dlsym(RTLD_DEFAULT, "Py_Version"); /* 3.11+: PY_VERSION_HEX */
    g_version = ver ? *ver : 0;
    g_this_tstate = (void *(*)(void))dlsym(RTLD_DEFAULT, "PyGILState_GetThisThreadState");
    g_code_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyCode_Type");
    g_unicode_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyUnicode_Type");
    g_bytes_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyBytes_Type");
    uint64_t probe = 0, self = 0x5eadbeefu;
    if ((g_version >> 16) != 0x030b)
      g_status = HS_INTERP_STATUS_VERSION;
    else if (!g_this_tstate || !g_code_type || !g_unicode_type || !g_bytes_type ||
             !symbol_range(eval, &g_eval_lo, &g_eval_hi))
      g_status = HS_INTERP_STATUS_SYMBOLS;
    else if (!rd(&probe, (uintptr_t)&self, 8) || probe != self)
      g_status = HS_INTERP_STATUS_READS;
    else
      g_status = HS_INTERP_STATUS_OK;
  } else {
    /* an interpreter whose symbols are not exported (a stripped or static python) */
    char exe[256];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    if (strncmp(base, "python", 6) == 0) {
      g_kind = HS_INTERP_PYTHON;
      g_status = HS_INTERP_STATUS_SYMBOLS;
    }
  }
  *kind = g_kind;
  *status = g_status;
  *version = g_version;
}

int _hs_interp_ready(void) { return g_status == HS_INTERP_STATUS_OK && g_kind; }

int _hs_interp_is_loop(uintptr_t ret) {
  uintptr_t a = ret - 1; /* a return address: the call is the byte before */
  return a >= g_eval_lo && a < g_eval_hi;
}

/* ---- line numbers: co_linetable (Objects/codeobject.c, 3.11), read in pieces ---- */
struct lt { uintptr_t at, end; unsigned char buf[224]; size_t have, pos; int bad; };

static int lt_byte(struct lt *t) {
  if (t->pos == t->have) {
    if (t->at >= t->end) return -1;
    size_t n = t->end - t->at < sizeof t->buf ? t->end - t->at : sizeof t->buf;
    if (!rd(t->buf, t->at, n)) { t->bad = 1; return -1; }
    t->at += n;
    t->have = n;
    t->pos = 0;
  }
  return t->buf[t->pos++];
}

static int lt_varint(struct lt *t) {
  int b = lt_byte(t);
  if (b < 0) return 0;
  unsigned val = (unsigned)b & 63, shift = 0;
  while ((b & 64) && shift < 30) {
    if ((b = lt_byte(t)) < 0) return 0;
    shift += 6;
    val |= ((unsigned)b & 63) << shift;
  }
  return (int)val;
}

/* The line of the instruction at byte offset addrq (PyCode_Addr2Line), -1 for none; the
 * table's first bytes (have of them) are in *t already. */
static int line_of(struct lt *tp, int first, int64_t addrq) {
  if (addrq < 0) return first;
  struct lt t = *tp;
  int line = first;
  int64_t start = 0;
  int b = lt_byte(&t);
  while (b >= 0 && !t.bad) {
    if (!(b & 128)) return -1; /* not an entry's first byte: not a table we know */
    int code = (b >> 3) & 15, delta = 0;
    int64_t end = start + ((b & 7) + 1) * 2;
    int next = -1;
    if (code == 13 || code == 14) { /* NO_COLUMNS, LONG: a signed varint */
      unsigned u = (unsigned)lt_varint(&t);
      delta = (u & 1) ? -(int)(u >> 1) : (int)(u >> 1);
    } else if (code >= 10 && code <= 12) {
      delta = code - 10; /* ONE_LINE0..2 */
    }
    line += delta;
    /* the rest of the entry: bytes without the top bit */
    while ((next = lt_byte(&t)) >= 0 && !(next & 128)) {}
    if (addrq >= start && addrq < end) return code == 15 ? -1 : line;
    start = end;
    b = next;
  }
  return -1;
}

/* What a frame needs of its code object, by (code object, function object): read and
 * type-checked the first time the pair is seen, then from here. Lock-free like the lines'
 * cache: an entry torn by two writers fails its check and is a miss. (A pair freed and
 * both addresses taken again by another function's would be named as the old one: never a
 * bad read, as nothing here is read through the cached words.) */
#define HS_CODE_CACHE 512
typedef struct { uint64_t code, func, name, file, table, units, first_ft, check; } hs_code_entry_t;
static hs_code_entry_t g_codes[HS_CODE_CACHE];

static uint64_t code_check(const uint64_t *w) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 7; i++) {
    h ^= w[i];
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  return h | 1;
}

static int code_cached(uint64_t code, uint64_t func, uint64_t *w) {
  hs_code_entry_t *e = &g_codes[((code >> 4) ^ (func >> 6)) & (HS_CODE_CACHE - 1)];
  const uint64_t *src = &e->code;
  for (int i = 0; i < 8; i++) w[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
  return w[0] == code && w[1] == func && w[7] == code_check(w);
}

static void code_store(const uint64_t *w) {
  hs_code_entry_t *e = &g_codes[((w[0] >> 4) ^ (w[1] >> 6)) & (HS_CODE_CACHE - 1)];
  uint64_t *dst = &e->code;
  __atomic_store_n(&dst[7], 0, __ATOMIC_RELAXED);
  for (int i = 0; i < 7; i++) __atomic_store_n(&dst[i], w[i], __ATOMIC_RELAXED);
  __atomic_store_n(&dst[7], code_check(w), __ATOMIC_RELEASE);
}

/* The line of a frame's instruction: from the cache, else its code object's line table
 * (a bytes object: its header and first bytes in one read); -1 when it cannot be read. */
static int frame_line(uintptr_t code, uintptr_t table, int first, int64_t addrq) {
  int line;
  if (line_cached(code, table, (uint64_t)addrq, &line)) return line;
  unsigned char head[PY_BYTES_SVAL];
  struct lt t = {0, 0, {0}, 0, 0, 0};
  int got = rd2(head, table, sizeof head, t.buf, table + PY_BYTES_SVAL, sizeof t.buf);
  if (!got || u64(head, PY_OB_TYPE) != g_bytes_type) return -1;
  int64_t len = (int64_t)u64(head, PY_OB_SIZE);
  if (len <= 0 || len >= (1 << 24)) return -1;
  t.at = table + PY_BYTES_SVAL;
  t.end = t.at + (uintptr_t)len;
  if (got == 2) { /* the first bytes came with the header */
    t.have = (size_t)len < sizeof t.buf ? (size_t)len : sizeof t.buf;
    t.at += t.have;
  }
  line = line_of(&t, first, addrq);
  if (line >= 0) line_store(code, table, (uint64_t)addrq, line);
  return line;
}

/* The thread's frames (all but a generator's) lie in its data stack, the innermost at its
 * top: its last HS_STACK_COPY bytes are read at once into this buffer, which one sample at
 * a time uses (another thread sampling meanwhile reads its frames one by one). */
#define HS_STACK_COPY 16384
static unsigned char g_copy[HS_STACK_COPY];
static int g_copy_busy;

/* A frame: from the copy when it lies in it, else read (with the code object of the frame
 * before, in the same system call). */
struct walk { uintptr_t lo, hi; };

static int in_copy(const struct walk *w, uintptr_t a) {
  return a >= w->lo && a + PY311_FRAME_BYTES <= w->hi;
}

/* This thread's Python frames, innermost first: at most max. */
int _hs_interp_frames(hs_iframe_t *out, int max) {
  if (!_hs_interp_ready()) return 0;
  uintptr_t ts = (uintptr_t)g_this_tstate(), cframe = 0, cur = 0, ds[3] = {0, 0, 0};
  if (!ts || !rd2(&cframe, ts + PY311_TSTATE_CFRAME, 8, ds, ts + PY311_TSTATE_DATASTACK, sizeof ds))
    return 0;
  struct walk w = {0, 0};
  int mine = !__atomic_exchange_n(&g_copy_busy, 1, __ATOMIC_ACQUIRE);
  uintptr_t first = ds[0] + PY311_CHUNK_DATA, top = ds[1];
  if (mine && ds[0] && top > first && top <= ds[2]) {
    w.lo = top - first > HS_STACK_COPY ? top - HS_STACK_COPY : first;
    w.hi = top;
    if (rd2(&cur, cframe + PY311_CFRAME_CURRENT, 8, g_copy, w.lo, w.hi - w.lo) != 2) w.lo = w.hi = 0;
  }
  if (!w.hi && !rd(&cur, cframe + PY311_CFRAME_CURRENT, 8)) cur = 0;
  int n = 0;
  unsigned char fr[PY311_FRAME_BYTES], next[PY311_FRAME_BYTES], co[PY311_CODE_ADAPTIVE];
  if (!cur) goto done;
  if (in_copy(&w, cur)) memcpy(fr, g_copy + (cur - w.lo), sizeof fr);
  else if (!rd(fr, cur, sizeof fr)) goto done;
  for (int depth = 0; n < max && depth < HS_INTERP_DEPTH * 2; depth++) {
    uintptr_t code = u64(fr, PY311_FRAME_CODE), prev = u64(fr, PY311_FRAME_PREVIOUS);
    uint64_t c[8]; /* code, func, name, file, table, units, first | firsttraceable << 32 */
    int copied = in_copy(&w, prev), got = 1;
    if (code_cached(code, u64(fr, PY311_FRAME_FUNC), c)) {
      if (prev && !copied) got = rd(next, prev, sizeof next) ? 2 : 1;
    } else {
      got = rd2(co, code, sizeof co, next, copied ? 0 : prev, sizeof next);
      if (!got || u64(co, PY_OB_TYPE) != g_code_type) break;
      c[0] = code;
      c[1] = u64(fr, PY311_FRAME_FUNC);
      c[2] = u64(co, PY311_CODE_QUALNAME);
      c[3] = u64(co, PY311_CODE_FILENAME);
      c[4] = u64(co, PY311_CODE_LINETABLE);
      c[5] = u64(co, PY_OB_SIZE);
      c[6] = (uint64_t)(uint32_t)i32(co, PY311_CODE_FIRSTLINENO) |
             (uint64_t)(uint32_t)i32(co, PY311_CODE_FIRSTTRACEABLE) << 32;
      code_store(c);
    }
    if (copied) {
      memcpy(next, g_copy + (prev - w.lo), sizeof next);
      got = 2;
    }
    int64_t units = (int64_t)c[5];
    int64_t addrq = (int64_t)(u64(fr, PY311_FRAME_PREV_INSTR) - (code + PY311_CODE_ADAPTIVE));
    int owner = fr[PY311_FRAME_OWNER], firstline = (int32_t)(uint32_t)c[6];
    hs_iframe_t *f = &out[n++];
    f->code = code;
    f->name = c[2];
    f->file = c[3];
    f->entry = fr[PY311_FRAME_IS_ENTRY] != 0;
    /* _PyFrame_IsIncomplete: pushed, not started (its line is not meaningful) */
    f->skip = owner != PY311_OWNED_BY_GENERATOR && addrq < (int64_t)(int32_t)(c[6] >> 32) * 2;
    f->line = firstline;
    if (!f->skip && addrq < units * 2) {
      int line = frame_line(code, c[4], firstline, addrq);
      if (line >= 0) f->line = line;
    }
    if (got < 2) break; /* the outermost frame (previous is NULL), or one not readable */
    memcpy(fr, next, sizeof fr);
  }
done:
  if (mine) __atomic_store_n(&g_copy_busy, 0, __ATOMIC_RELEASE);
  return n;
}

/* A Python str's UTF-8 bytes (compact ASCII, or the UTF-8 copy a str keeps once asked),
 * at most max; 0 when it is neither or cannot be read. */
static size_t str_bytes(uintptr_t s, char *dst, size_t max, int tail) {
  unsigned char h[64];
  if (!rd(h, s, sizeof h) || u64(h, PY_OB_TYPE) != g_unicode_type) return 0;
  unsigned state = (unsigned)i32(h, PY_UNICODE_STATE);
  int compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  uint64_t len = u64(h, PY_UNICODE_LENGTH);
  uintptr_t data = 0;
  if (compact && ascii) {
    data = s + PY_UNICODE_ASCII_DATA;
  } else {
    len = u64(h, PY_UNICODE_UTF8_LENGTH);
    data = u64(h, PY_UNICODE_UTF8);
  }
  if (!data || len > (1u << 20)) return 0;
  size_t n = len < max ? (size_t)len : max;
  if (tail) data += len - n; /* a long path keeps its end: the file's name is what shows */
  return n && rd(dst, data, n) ? n : 0;
}

/* The names of a frame, for its record: function then file, their lengths in *nlen, *flen. */
size_t _hs_interp_names(const hs_iframe_t *f, char *dst, size_t max, uint32_t *nlen,
                        uint32_t *flen) {
  size_t a = str_bytes(f->name, dst, max / 2, 0);
  size_t b = str_bytes(f->file, dst + a, max - a, 1);
  *nlen = (uint32_t)a;
  *flen = (uint32_t)b;
  return a + b;
}
