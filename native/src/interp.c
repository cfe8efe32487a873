/* interp.c: the interpreter's own frames at a sampled allocation (CPython 3.8-3.13, Perl
 * 5.36), so a call site names the program's function (build_alpha (script.py:12)) and not
 * the interpreter's (PyByteArray_Resize (python3.11)). profile.c splices them into the
 * native stack where the interpreter's loop (_PyEval_EvalFrameDefault,
 * Perl_runops_standard) is, innermost first. Perl's part is at the end of this file.
 *
 * How it reads: the thread's own state (PyGILState_GetThisThreadState: a read of the
 * thread's TSS key, no lock, no allocation; NULL for a thread Python never saw), then the
 * chain of _PyInterpreterFrame (before 3.11: PyFrameObject, f_back) from the thread's
 * current frame, following `previous`,
 * at most HS_INTERP_DEPTH frames. The GIL is not taken and nothing in the interpreter is
 * called but that one function: the frames read are the allocating thread's own, which
 * cannot change while it is inside malloc (another thread may run Python meanwhile, as
 * when the allocating thread released the GIL; it does not touch these frames). Every read
 * goes through process_vm_readv on this process, which fails with EFAULT on an address not
 * mapped instead of faulting, and every object is checked for its type as it is reached
 * (a code object's ob_type is &PyCode_Type, a name's &PyUnicode_Type, the line table's
 * &PyBytes_Type, addresses found with dlsym): a stale or torn pointer ends the walk. No
 * malloc, no lock, no signal handler. The cost: the thread's data stack (where its frames
 * are) is copied in one call and the frames' code objects read in one more (3.11+); a line
 * is decoded once per (code, instruction) and then cached; names are read only when
 * profile.c first stores a (code, line) (bench/interp-frames).
 *
 * Offsets: a table per version (py_layouts below: 3.11, 3.12, 3.13; py_old_layouts: 3.8,
 * 3.9, 3.10; from their headers: Include/internal/pycore_frame.h, cpython/code.h,
 * cpython/pystate.h, cpython/unicodeobject.h, frameobject.h), used only for the version
 * the running interpreter says (Py_Version; before 3.11 Py_GetVersion(), called once at
 * start); 3.13's are also checked against the _Py_DebugOffsets the interpreter publishes at
 * the start of _PyRuntime, and not used if any differs. Other versions are not read: the
 * run's summary says so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hs_internal.h"

/* ---- CPython (x86-64/aarch64, LP64) ---- */
typedef struct {
  unsigned minor;             /* 3.minor */
  uint16_t ts_cframe;         /* PyThreadState.cframe; 0: none (3.13: the state's own) */
  uint16_t current_frame;     /* _PyCFrame.current_frame, or PyThreadState.current_frame */
  uint16_t ts_datastack;      /* PyThreadState.datastack_chunk, then _top and _limit */
  uint16_t f_func, f_code, f_previous, f_instr, f_owner; /* _PyInterpreterFrame */
  int16_t f_is_entry;         /* -1: none (3.12+: a FRAME_OWNED_BY_CSTACK frame ends a call) */
  uint16_t co_firstlineno, co_filename, co_qualname, co_linetable, co_firsttraceable,
      co_adaptive;            /* PyCodeObject; co_code_adaptive: the instructions */
  uint16_t u_ascii, u_utf8_length, u_utf8; /* sizeof(PyASCIIObject), PyCompactUnicodeObject */
} hs_pylayout_t;

static const hs_pylayout_t py_layouts[] = {
    /* 3.11: f_func, f_code, previous, prev_instr, owner, is_entry */
    {11, 56, 8, 296, 0, 32, 48, 56, 69, 68, 72, 112, 128, 136, 168, 184, 48, 48, 56},
    /* 3.12: f_code, previous, f_funcobj, prev_instr, owner; entry frames on the C stack */
    {12, 56, 0, 232, 16, 0, 8, 56, 70, -1, 68, 112, 128, 136, 176, 192, 40, 40, 48},
    /* 3.13: f_executable, previous, f_funcobj, instr_ptr, owner */
    {13, 0, 72, 232, 16, 0, 8, 56, 70, -1, 68, 112, 128, 136, 184, 200, 40, 40, 48},
};
static const hs_pylayout_t *L;  /* the running interpreter's (3.11+) */

/* CPython 3.8-3.10: a PyFrameObject per call (heap objects, f_back), one eval loop each; the
 * code object has no qualified name (co_name); lines from co_lnotab (3.8, 3.9: pairs of
 * address and line increments) or co_linetable (3.10: pairs of address delta and signed
 * line delta, -128 for none). */
typedef struct {
  unsigned minor;
  uint16_t ts_frame;          /* PyThreadState.frame */
  uint16_t f_back, f_code, f_lasti; /* PyFrameObject */
  uint16_t co_firstlineno, co_filename, co_name, co_lines; /* co_lnotab or co_linetable */
  uint8_t lasti_units;        /* f_lasti counts code units (3.10), not bytes */
  uint8_t table;              /* LT_LNOTAB or LT_310 */
} hs_pyold_t;
enum { LT_311 = 0, LT_LNOTAB = 1, LT_310 = 2 };
static const hs_pyold_t py_old_layouts[] = {
    {8, 24, 24, 32, 104, 40, 104, 112, 120, 0, LT_LNOTAB},
    {9, 24, 24, 32, 104, 40, 104, 112, 120, 0, LT_LNOTAB},
    {10, 24, 24, 32, 96, 40, 104, 112, 120, 1, LT_310},
};
static const hs_pyold_t *LO;    /* the running interpreter's (3.8-3.10) */
static uintptr_t g_frame_type;  /* &PyFrame_Type (3.8-3.10) */
/* A str's layout: sizeof(PyASCIIObject), PyCompactUnicodeObject.utf8_length, .utf8 */
static uint16_t g_u_ascii = 48, g_u_utf8_length = 48, g_u_utf8 = 56;

#define PY_CHUNK_DATA 24               /* _PyStackChunk.data */
#define PY_FRAME_BYTES 72              /* what of a frame is read */
#define PY_CODE_BYTES 200              /* what of a code object is read (to co_code_adaptive) */
#define PY_OWNED_BY_GENERATOR 1
#define PY_OWNED_BY_CSTACK 3
#define PY_OB_TYPE 8                   /* PyObject.ob_type */
#define PY_OB_SIZE 16                  /* PyVarObject.ob_size */
#define PY_BYTES_SVAL 32               /* PyBytesObject.ob_sval */
#define PY_UNICODE_LENGTH 16           /* PyASCIIObject.length */
#define PY_UNICODE_STATE 32            /*   .state: interned:2 kind:3 compact:1 ascii:1 ... */

/* 3.13's _Py_DebugOffsets (Include/internal/pycore_runtime.h), at _PyRuntime's start: where
 * its fields are, to check the table's against (a build whose offsets differ is not read). */
static const struct { uint16_t at, want_of; } py313_debug[] = {
    {184, 0}, /* thread_state.current_frame */
    {232, 1}, /* interpreter_frame.previous */
    {240, 2}, /* interpreter_frame.executable */
    {248, 3}, /* interpreter_frame.instr_ptr */
    {264, 4}, /* interpreter_frame.owner */
    {280, 5}, /* code_object.filename */
    {296, 6}, /* code_object.qualname */
    {304, 7}, /* code_object.linetable */
    {312, 8}, /* code_object.firstlineno */
    {344, 9}, /* code_object.co_code_adaptive */
    {560, 10}, /* unicode_object.asciiobject_size */
};

static uint64_t py313_want(const hs_pylayout_t *l, int which) {
  const uint16_t v[] = {l->current_frame, l->f_previous, l->f_code, l->f_instr, l->f_owner,
                        l->co_filename, l->co_qualname, l->co_linetable, l->co_firstlineno,
                        l->co_adaptive, l->u_ascii};
  return v[which];
}

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

static void perl_start(int off);

/* 3.minor of a CPython before 3.11 (no Py_Version), from Py_GetVersion's "3.10.13 (main,
 * ...)" (a static buffer: nothing allocated); 0 when it says no 3.x. */
static unsigned py_old_minor(void) {
  const char *(*get_version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
  const char *v = get_version ? get_version() : "";
  unsigned maj = 0, min = 0;
  while (*v >= '0' && *v <= '9') maj = maj * 10 + (unsigned)(*v++ - '0');
  if (*v++ == '.')
    while (*v >= '0' && *v <= '9') min = min * 10 + (unsigned)(*v++ - '0');
  return maj == 3 ? min : 0;
}

/* Where CPython says its teardown began: _PyRuntime._finalizing, which Py_FinalizeEx sets
 * (to the finalizing thread's state) once the program's atexit callbacks and its
 * non-daemon threads are done, before modules, objects and the interpreter go. Its
 * offset in _PyRuntimeState (Include/internal/pycore_runtime.h; 3.8, pycore_pystate.h):
 * after four ints in 3.8-3.10, five in 3.11 and 3.12; 3.13 says it in the _Py_DebugOffsets
 * at _PyRuntime's start (runtime_state.finalizing, after the cookie, the version,
 * free_threaded and runtime_state.size), taken only when the cookie and the version agree
 * and it lies inside the structure (runtime_state.size). The CLI reads the word from
 * outside; nothing reads it here. 0 for no CPython, or a version not known. */
uint64_t _hs_py_finalizing_addr(void) {
  _hs_mappings_resolve(); /* before a lookup that may fail (mappings.c says why) */
  const unsigned char *rt = dlsym(RTLD_DEFAULT, "_PyRuntime");
  if (!rt) return 0;
  const uint32_t *ver = dlsym(RTLD_DEFAULT, "Py_Version"); /* 3.11+: PY_VERSION_HEX */
  unsigned minor = ver ? ((*ver >> 24) == 3 ? (*ver >> 16) & 0xff : 0) : py_old_minor();
  if (minor >= 8 && minor <= 10) return (uint64_t)(uintptr_t)(rt + 16);
  if (minor == 11 || minor == 12) return (uint64_t)(uintptr_t)(rt + 24);
  if (minor == 13) {
    uint64_t version, size, off;
    memcpy(&version, rt + 8, 8);
    memcpy(&size, rt + 24, 8);
    memcpy(&off, rt + 32, 8);
    if (memcmp(rt, "xdebugpy", 8) == 0 && version == *ver && off >= 40 && off + 8 <= size &&
        off % 8 == 0)
      return (uint64_t)(uintptr_t)(rt + off);
  }
  return 0;
}

void _hs_interp_start(int *kind, int *status, uint64_t *version) {
  g_pid = getpid();
  _hs_mappings_resolve(); /* the lookups below fail in most programs (mappings.c says why) */
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
    for (size_t i = 0; i < sizeof py_layouts / sizeof *py_layouts; i++)
      if ((g_version >> 16) == (0x0300u | py_layouts[i].minor)) L = &py_layouts[i];
    if (L && L->minor == 13) { /* the interpreter's own offsets must agree with the table */
      const unsigned char *rt = dlsym(RTLD_DEFAULT, "_PyRuntime");
      uint64_t v;
      if (!rt || memcmp(rt, "xdebugpy", 8) != 0 || (memcpy(&v, rt + 8, 8), v != g_version)) L = NULL;
      for (size_t i = 0; L && i < sizeof py313_debug / sizeof *py313_debug; i++) {
        memcpy(&v, rt + py313_debug[i].at, 8);
        if (v != py313_want(L, py313_debug[i].want_of)) L = NULL;
      }
    }
    if (L) {
      g_u_ascii = L->u_ascii;
      g_u_utf8_length = L->u_utf8_length;
      g_u_utf8 = L->u_utf8;
    } else if (!ver) { /* before 3.11: Py_GetVersion's "3.10.13 (main, ...)" */
      unsigned min = py_old_minor();
      g_frame_type = (uintptr_t)dlsym(RTLD_DEFAULT, "PyFrame_Type");
      for (size_t i = 0; min && i < sizeof py_old_layouts / sizeof *py_old_layouts; i++)
        if (py_old_layouts[i].minor == min) LO = &py_old_layouts[i];
      if (LO) g_version = 0x03000000u | LO->minor << 16;
    }
    if (!L && !(LO && g_frame_type))
      g_status = HS_INTERP_STATUS_VERSION;
    else if (!g_this_tstate || !g_code_type || !g_unicode_type || !g_bytes_type ||
             !symbol_range(eval, &g_eval_lo, &g_eval_hi))
      g_status = HS_INTERP_STATUS_SYMBOLS;
    else if (!rd(&probe, (uintptr_t)&self, 8) || probe != self)
      g_status = HS_INTERP_STATUS_READS;
    else
      g_status = HS_INTERP_STATUS_OK;
  } else if (dlsym(RTLD_DEFAULT, "Perl_runops_standard")) {
    perl_start(want && strcmp(want, "0") == 0);
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

/* (not under a seccomp filter: its frames are read with process_vm_readv, which a filter
 * may forbid, and then the program dies of it inside its malloc) */
int _hs_interp_ready(void) {
  return g_status == HS_INTERP_STATUS_OK && g_kind && !__atomic_load_n(&_hs_seccomp, __ATOMIC_RELAXED);
}

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

/* The line at addrq in 3.8-3.10's tables (PyCode_Addr2Line, _PyCode_CheckLineNumber). */
static int line_of_old(struct lt *tp, int first, int64_t addrq, int kind) {
  struct lt t = *tp;
  int line = first;
  int64_t start = 0;
  for (;;) {
    int a = lt_byte(&t), b = lt_byte(&t);
    if (a < 0 || b < 0) return kind == LT_LNOTAB ? line : -1;
    int delta = (signed char)b;
    if (kind == LT_LNOTAB) { /* (address increment, line increment) */
      start += a;
      if (start > addrq) return line;
      line += delta;
    } else { /* 3.10: (address delta, line delta or -128: no line) */
      int64_t end = start + a;
      if (delta != -128) line += delta;
      if (end > start && addrq >= start && addrq < end) return delta == -128 ? -1 : line;
      start = end;
    }
  }
}

/* Perl's subs' names by address (perl_sub_name): read and type-checked the first time, then
 * from here. Lock-free like the lines' cache: an entry torn by two
 * writers fails its check and is a miss. A sub freed and its address taken by another would
 * be named as the old one (an anonymous sub's: both __ANON__, mostly); never a bad read, as
 * nothing is read through the cached words. (Python's code objects are not cached
 * so: a module's code and its function are freed once it is imported, and the next
 * module's often take both addresses.) */
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
static int frame_line(uintptr_t code, uintptr_t table, int first, int64_t addrq, int kind) {
  int line;
  uint64_t key = table ^ (uint64_t)(uint32_t)first << 48; /* the cache's: with the first line */
  if (line_cached(code, key, (uint64_t)addrq, &line)) return line;
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
  line = kind == LT_311 ? line_of(&t, first, addrq) : line_of_old(&t, first, addrq, kind);
  if (line >= 0) line_store(code, key, (uint64_t)addrq, line);
  return line;
}

/* The thread's frames (all but a generator's) lie in its data stack, the innermost at its
 * top: its last HS_STACK_COPY bytes are read at once into this buffer, which one sample at
 * a time uses (another thread sampling meanwhile reads its frames one by one). */
#define HS_STACK_COPY 16384
static unsigned char g_copy[HS_STACK_COPY];
static unsigned char g_code_buf[HS_INTERP_DEPTH * PY_CODE_BYTES]; /* the code objects read */
static int g_copy_busy;

/* A frame: from the copy when it lies in it, else read (with the code object of the frame
 * before, in the same system call). */
struct walk { uintptr_t lo, hi; };

static int in_copy(const struct walk *w, uintptr_t a) {
  return a >= w->lo && a + PY_FRAME_BYTES <= w->hi;
}

static int perl_frames(hs_iframe_t *out, int max);

int _hs_interp_kind(void) { return g_kind; }

/* 3.8-3.10: the frame objects from tstate->frame, each its own eval loop's. A frame's code
 * object and the next frame are read in one call. */
static int py_old_frames(hs_iframe_t *out, int max) {
  uintptr_t ts = (uintptr_t)g_this_tstate(), cur = 0;
  if (!ts || !rd(&cur, ts + LO->ts_frame, 8) || !cur) return 0;
  unsigned char fr[112], next[112], co[128];
  if (!rd(fr, cur, sizeof fr) || u64(fr, PY_OB_TYPE) != g_frame_type) return 0;
  int n = 0;
  for (int depth = 0; n < max && depth < HS_INTERP_DEPTH * 2; depth++) {
    uintptr_t code = u64(fr, LO->f_code), prev = u64(fr, LO->f_back);
    int got = rd2(co, code, sizeof co, next, prev, sizeof next);
    if (!got || u64(co, PY_OB_TYPE) != g_code_type) break;
    int64_t lasti = i32(fr, LO->f_lasti), addrq = LO->lasti_units ? lasti * 2 : lasti;
    int firstline = i32(co, LO->co_firstlineno);
    hs_iframe_t *f = &out[n++];
    f->code = code;
    f->name = u64(co, LO->co_name);
    f->file = u64(co, LO->co_filename);
    f->entry = 1; /* one eval loop a frame */
    f->skip = 0;
    f->line = firstline;
    if (addrq >= 0) {
      int line = frame_line(code, u64(co, LO->co_lines), firstline, addrq, LO->table);
      if (line >= 0) f->line = line;
    }
    if (got < 2 || u64(next, PY_OB_TYPE) != g_frame_type) break;
    memcpy(fr, next, sizeof fr);
  }
  return n;
}

/* This thread's Python frames, innermost first: at most max. */
int _hs_interp_frames(hs_iframe_t *out, int max) {
  if (!_hs_interp_ready()) return 0;
  if (g_kind == HS_INTERP_PERL) return perl_frames(out, max);
  if (LO) return py_old_frames(out, max);
  uintptr_t ts = (uintptr_t)g_this_tstate(), at = 0, cur = 0, ds[3] = {0, 0, 0};
  /* 3.11, 3.12: the frame is the C frame's (tstate->cframe); 3.13: the state's own */
  if (!ts || !rd2(&at, ts + (L->ts_cframe ? L->ts_cframe : L->current_frame), 8, ds,
                  ts + L->ts_datastack, sizeof ds))
    return 0;
  struct walk w = {0, 0};
  int mine = !__atomic_exchange_n(&g_copy_busy, 1, __ATOMIC_ACQUIRE);
  uintptr_t first = ds[0] + PY_CHUNK_DATA, top = ds[1];
  if (mine && ds[0] && top > first && top <= ds[2]) {
    w.lo = top - first > HS_STACK_COPY ? top - HS_STACK_COPY : first;
    w.hi = top;
    if (L->ts_cframe) {
      if (rd2(&cur, at + L->current_frame, 8, g_copy, w.lo, w.hi - w.lo) != 2) w.lo = w.hi = 0;
    } else if (!rd(g_copy, w.lo, w.hi - w.lo)) {
      w.lo = w.hi = 0;
    }
  }
  if (!L->ts_cframe) cur = at;
  else if (!w.hi && !rd(&cur, at + L->current_frame, 8)) cur = 0;
  int n = 0, nf = 0;
  unsigned char fr[PY_FRAME_BYTES];
  struct { uint64_t code, instr; uint8_t owner, entry; } fs[HS_INTERP_DEPTH];
  if (!cur || max > HS_INTERP_DEPTH) goto done;
  if (in_copy(&w, cur)) memcpy(fr, g_copy + (cur - w.lo), sizeof fr);
  else if (!rd(fr, cur, sizeof fr)) goto done;
  /* the frames: from the copy, or read one by one (a generator's, in its own object) */
  for (int depth = 0; nf < max && depth < HS_INTERP_DEPTH * 2; depth++) {
    uintptr_t prev = u64(fr, L->f_previous);
    int owner = fr[L->f_owner];
    if (L->f_is_entry < 0 && owner == PY_OWNED_BY_CSTACK) {
      /* 3.12+: the eval loop's own frame, on the C stack: the frames before it are that
       * loop's; it is no Python code (3.13: its executable is None) */
      if (nf) fs[nf - 1].entry = 1;
    } else {
      fs[nf].code = u64(fr, L->f_code);
      fs[nf].instr = u64(fr, L->f_instr);
      fs[nf].owner = (uint8_t)owner;
      fs[nf].entry = L->f_is_entry >= 0 && fr[L->f_is_entry] != 0;
      nf++;
    }
    if (!prev) break;
    if (in_copy(&w, prev)) memcpy(fr, g_copy + (prev - w.lo), sizeof fr);
    else if (!rd(fr, prev, sizeof fr)) break;
  }
  /* their code objects, each read where the frame points now (never from an earlier
   * sample: a code object freed since could have left its address to another), all in one
   * system call when this walk holds the shared buffer */
  size_t cb = L->co_adaptive;
  int ncode = 0, slot[HS_INTERP_DEPTH], nu = 0;
  if (mine) {
    struct iovec lv[HS_INTERP_DEPTH], rv[HS_INTERP_DEPTH];
    for (int i = 0; i < nf; i++) { /* each code object once (a recursion repeats them) */
      int j = 0;
      while (j < i && fs[j].code != fs[i].code) j++;
      if (j < i) { slot[i] = slot[j]; continue; }
      slot[i] = nu;
      lv[nu] = (struct iovec){g_code_buf + (size_t)nu * PY_CODE_BYTES, cb};
      rv[nu++] = (struct iovec){(void *)(uintptr_t)fs[i].code, cb};
    }
    long got = nu && fs[0].code >= 4096
                   ? syscall(SYS_process_vm_readv, g_pid, lv, (unsigned long)nu, rv, (unsigned long)nu, 0UL)
                   : 0;
    ncode = got > 0 ? (int)((size_t)got / cb) : 0;
  }
  for (int i = 0; i < nf && n < max; i++) {
    unsigned char own[PY_CODE_BYTES], *co = own;
    if (mine && slot[i] < ncode) co = g_code_buf + (size_t)slot[i] * PY_CODE_BYTES;
    else if (!rd(own, fs[i].code, cb)) break;
    if (u64(co, PY_OB_TYPE) != g_code_type) break;
    uint64_t code = fs[i].code, table = u64(co, L->co_linetable);
    int64_t units = (int64_t)u64(co, PY_OB_SIZE);
    /* the instruction: prev_instr (3.11, 3.12) or instr_ptr (3.13), as a byte offset */
    int64_t addrq = (int64_t)(fs[i].instr - (code + L->co_adaptive));
    int firstline = i32(co, L->co_firstlineno);
    hs_iframe_t *f = &out[n++];
    f->code = code;
    f->name = u64(co, L->co_qualname);
    f->file = u64(co, L->co_filename);
    f->entry = fs[i].entry;
    /* _PyFrame_IsIncomplete: pushed, not started (its line is not meaningful) */
    f->skip = fs[i].owner != PY_OWNED_BY_GENERATOR && addrq < (int64_t)i32(co, L->co_firsttraceable) * 2;
    f->line = firstline;
    if (!f->skip && addrq < units * 2) {
      int line = frame_line(code, table, firstline, addrq, LT_311);
      if (line >= 0) f->line = line;
    }
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
    data = s + g_u_ascii;
  } else {
    len = u64(h, g_u_utf8_length);
    data = u64(h, g_u_utf8);
  }
  if (!data || len > (1u << 20)) return 0;
  size_t n = len < max ? (size_t)len : max;
  if (tail) data += len - n; /* a long path keeps its end: the file's name is what shows */
  return n && rd(dst, data, n) ? n : 0;
}

/* The names of a frame, for its record: function then file, their lengths in *nlen, *flen. */
static size_t hek_bytes(uintptr_t hek, char *dst, size_t max);
static size_t cstr_bytes(uintptr_t s, char *dst, size_t max);

size_t _hs_interp_names(const hs_iframe_t *f, char *dst, size_t max, uint32_t *nlen,
                        uint32_t *flen) {
  size_t a, b;
  if (g_kind == HS_INTERP_PERL) {
    a = f->name ? hek_bytes(f->name, dst, max / 2) : 0;
    if (!f->name) { memcpy(dst, "main", 4); a = 4; } /* the file's own code */
    b = cstr_bytes(f->file, dst + a, max - a);
    *nlen = (uint32_t)a;
    *flen = (uint32_t)b;
    return a + b;
  }
  a = str_bytes(f->name, dst, max / 2, 0);
  b = str_bytes(f->file, dst + a, max - a, 1);
  *nlen = (uint32_t)a;
  *flen = (uint32_t)b;
  return a + b;
}

/* ---- Perl 5.36, threaded (useithreads) ----
 * The thread's interpreter is pthread_getspecific(PL_thr_key) (PERL_GET_CONTEXT: no lock, no
 * allocation); its PL_curcop is the statement running (file and line), and the context
 * stack of its current stack info (PL_curstackinfo->si_cxstack, si_cxix) holds a CXt_SUB
 * entry for each sub being run, innermost last, with the sub (blk_sub.cv) and the statement
 * that called it (blk_oldcop). So the Perl frames are: the innermost sub at PL_curcop, each
 * outer sub at the statement of its callee's call, and "main" at the outermost call. Subs do
 * not recurse in C (pp_entersub returns to the runops loop), so all of them are spliced at
 * the innermost Perl_runops_standard. Offsets from the 5.36 headers (intrpvar.h, cop.h,
 * sv.h, cv.h, gv.h, hv.h) of Debian's threaded x86-64 build, used only when PL_revision and
 * PL_version say 5.36, PL_thr_key exists (a threaded build), and the interpreter found is the one PL_curinterp names for the main thread; a COP's
 * op_type is checked (nextstate or dbstate), a sub's SvTYPE (PVCV), a glob's (PVGV). */
#define PL536_CURCOP 208          /* struct interpreter: Icurcop */
#define PL536_CURSTACKINFO 224    /*   Icurstackinfo */
#define PL536_SI_CXSTACK 8        /* struct stackinfo: si_cxstack */
#define PL536_SI_CXIX 32          /*   si_cxix (I32) */
#define PL536_CX_BYTES 104        /* sizeof(PERL_CONTEXT) */
#define PL536_CX_OLDCOP 16        /*   blk_oldcop */
#define PL536_CX_SUB_CV 72        /*   blk_sub.cv */
#define PL536_CXTYPEMASK 15
#define PL536_CXT_SUB 9
#define PL536_COP_TYPE 32         /* op_type: 9 bits of a U16 */
#define PL536_COP_LINE 36
#define PL536_COP_FILE 48         /* char *cop_file (threaded) */
#define PL536_OP_NEXTSTATE 195
#define PL536_OP_DBSTATE 196
#define PL536_SV_FLAGS 12         /* SvTYPE: the low 8 bits */
#define PL536_SVT_PVGV 9
#define PL536_SVT_PVCV 13
#define PL536_XPVCV_GV 56         /* xcv_gv_u: GV *, or HEK * when CvNAMED */
#define PL536_XPVCV_FLAGS 92
#define PL536_CVF_NAMED 0x8000
#define PL536_XPVGV_NAMEHEK 32    /* xiv_u.xivu_namehek: GvNAME_HEK */
#define PL536_HEK_LEN 4
#define PL536_HEK_KEY 8

static const unsigned *g_perl_key; /* &PL_thr_key */
static void **g_perl_curinterp;    /* &PL_curinterp */
static int g_perl_checked;         /* the interpreter's layout was checked once */

static void perl_start(int off) {
  g_kind = HS_INTERP_PERL;
  if (off) { g_status = HS_INTERP_STATUS_OFF; return; }
  void *runops = dlsym(RTLD_DEFAULT, "Perl_runops_standard");
  g_perl_key = dlsym(RTLD_DEFAULT, "PL_thr_key");
  g_perl_curinterp = dlsym(RTLD_DEFAULT, "PL_curinterp");
  const unsigned char *rev = dlsym(RTLD_DEFAULT, "PL_revision"), *ver = dlsym(RTLD_DEFAULT, "PL_version"),
                      *sub = dlsym(RTLD_DEFAULT, "PL_subversion");
  if (rev && ver && sub) g_version = (uint64_t)*rev << 24 | (uint64_t)*ver << 16 | (uint64_t)*sub << 8;
  uint64_t probe = 0, self = 0x5eadbeefu;
  if ((g_version >> 16) != ((uint64_t)5 << 8 | 36) || !g_perl_key)
    g_status = HS_INTERP_STATUS_VERSION; /* another version, or an unthreaded build */
  else if (!g_perl_curinterp || !symbol_range(runops, &g_eval_lo, &g_eval_hi))
    g_status = HS_INTERP_STATUS_SYMBOLS;
  else if (!rd(&probe, (uintptr_t)&self, 8) || probe != self)
    g_status = HS_INTERP_STATUS_READS;
  else
    g_status = HS_INTERP_STATUS_OK;
}

/* A COP's line and file from its bytes; 0 when it is no statement. (Read at every sample,
 * never cached: a required file's statements are freed once it has run, and the next
 * file's may take their addresses.) */
#define PL536_COP_BYTES 56
static int cop_decode(const unsigned char *c, int32_t *line, uint64_t *file) {
  uint16_t type;
  memcpy(&type, c + PL536_COP_TYPE, 2);
  type &= 0x1ff;
  if (type != PL536_OP_NEXTSTATE && type != PL536_OP_DBSTATE) return 0;
  *line = i32(c, PL536_COP_LINE);
  *file = u64(c, PL536_COP_FILE);
  return 1;
}

static int perl_cop(uintptr_t cop, int32_t *line, uint64_t *file) {
  unsigned char c[PL536_COP_BYTES];
  return rd(c, cop, sizeof c) && cop_decode(c, line, file);
}

/* The HEK of a sub's name (CvNAMED: its own; else its glob's), cached like a code object's
 * fields (by the CV); 0 when it cannot be read. */
static uint64_t perl_sub_name(uintptr_t cv) {
  uint64_t c[8];
  if (code_cached(cv, 1, c)) return c[2];
  unsigned char sv[16], body[96], gv[16];
  if (!rd(sv, cv, sizeof sv) || ((uint32_t)i32(sv, PL536_SV_FLAGS) & 0xff) != PL536_SVT_PVCV) return 0;
  if (!rd(body, u64(sv, 0), sizeof body)) return 0;
  uint64_t hek = u64(body, PL536_XPVCV_GV);
  uint32_t flags;
  memcpy(&flags, body + PL536_XPVCV_FLAGS, 4);
  if (!(flags & PL536_CVF_NAMED)) {
    uint64_t body_gv = 0;
    if (!rd(gv, hek, sizeof gv) || ((uint32_t)i32(gv, PL536_SV_FLAGS) & 0xff) != PL536_SVT_PVGV ||
        !rd(&body_gv, u64(gv, 0) + PL536_XPVGV_NAMEHEK, 8))
      return 0;
    hek = body_gv;
  }
  c[0] = cv;
  c[1] = 1;
  c[2] = hek;
  c[3] = c[4] = c[5] = c[6] = 0;
  code_store(c);
  return hek;
}

static int perl_frames(hs_iframe_t *out, int max) {
  void *interp = pthread_getspecific(*g_perl_key);
  if (!interp) return 0;
  if (!__atomic_load_n(&g_perl_checked, __ATOMIC_ACQUIRE)) {
    /* the layout, once: the main interpreter is PL_curinterp, and its PL_curcop a COP */
    void *main_interp = NULL;
    uint64_t cop = 0, file;
    int32_t line;
    if (!rd(&main_interp, (uintptr_t)g_perl_curinterp, 8) || main_interp != interp ||
        !rd(&cop, (uintptr_t)interp + PL536_CURCOP, 8) || !perl_cop(cop, &line, &file))
      return 0;
    __atomic_store_n(&g_perl_checked, 1, __ATOMIC_RELEASE);
  }
  uint64_t iv[3]; /* Icurcop, (Icurstash), Icurstackinfo */
  if (!rd(iv, (uintptr_t)interp + PL536_CURCOP, sizeof iv)) return 0;
  uint64_t cop = iv[0], si = iv[2];
  unsigned char sib[40];
  uint64_t cxstack = 0;
  int32_t cxix = -1;
  if (rd(sib, si, sizeof sib)) {
    cxstack = u64(sib, PL536_SI_CXSTACK);
    cxix = i32(sib, PL536_SI_CXIX);
  }
  /* the sub contexts, innermost first (the context stack read at once when it fits): each
   * sub with the statement it is at, then the file's own code ("main") */
  struct { uint64_t cv, cop; } e[HS_INTERP_DEPTH];
  int ne = 0, n = 0;
  int mine = !__atomic_exchange_n(&g_copy_busy, 1, __ATOMIC_ACQUIRE);
  int whole = mine && cxix >= 0 && (uint64_t)(cxix + 1) * PL536_CX_BYTES <= HS_STACK_COPY &&
              rd(g_copy, cxstack, (size_t)(cxix + 1) * PL536_CX_BYTES);
  for (int ix = cxix; ix >= 0 && ne < max - 1 && ne < HS_INTERP_DEPTH - 1 && cxix - ix < 4096; ix--) {
    unsigned char cx[PL536_CX_BYTES];
    if (whole) memcpy(cx, g_copy + (size_t)ix * PL536_CX_BYTES, sizeof cx);
    else if (!rd(cx, cxstack + (uint64_t)ix * PL536_CX_BYTES, sizeof cx)) break;
    if ((cx[0] & PL536_CXTYPEMASK) != PL536_CXT_SUB) continue;
    e[ne].cv = u64(cx, PL536_CX_SUB_CV);
    e[ne++].cop = cop;
    cop = u64(cx, PL536_CX_OLDCOP);
  }
  e[ne].cv = 0;
  e[ne++].cop = cop;
  /* their statements, in one system call when this walk holds the shared buffers */
  int nread = 0;
  if (mine) {
    struct iovec lv[HS_INTERP_DEPTH], rv[HS_INTERP_DEPTH];
    while (nread < ne && e[nread].cop >= 4096) {
      lv[nread] = (struct iovec){g_code_buf + (size_t)nread * PL536_COP_BYTES, PL536_COP_BYTES};
      rv[nread] = (struct iovec){(void *)(uintptr_t)e[nread].cop, PL536_COP_BYTES};
      nread++;
    }
    long got = nread ? syscall(SYS_process_vm_readv, g_pid, lv, (unsigned long)nread, rv,
                               (unsigned long)nread, 0UL)
                     : 0;
    nread = got > 0 ? (int)(got / PL536_COP_BYTES) : 0;
  }
  for (int k = 0; k < ne; k++) {
    hs_iframe_t *f = &out[n];
    memset(f, 0, sizeof *f);
    f->code = e[k].cv;
    int ok = k < nread ? cop_decode(g_code_buf + (size_t)k * PL536_COP_BYTES, &f->line, &f->file)
                       : perl_cop(e[k].cop, &f->line, &f->file);
    if (e[k].cv) { /* a sub: a frame even when unnamed, so that "main" stays outermost */
      f->name = perl_sub_name(e[k].cv);
      if (!f->name || !ok) { f->skip = 1; f->name = 1; }
      n++;
    } else if (ok) {
      n++; /* the file's top level: "main" */
    }
  }
  if (mine) __atomic_store_n(&g_copy_busy, 0, __ATOMIC_RELEASE);
  if (n) out[n - 1].entry = 1; /* all of them at the innermost runops */
  return n;
}

/* A HEK's key (a sub's name), at most max bytes. */
static size_t hek_bytes(uintptr_t hek, char *dst, size_t max) {
  int32_t len = 0;
  if (!rd(&len, hek + PL536_HEK_LEN, 4) || len <= 0 || len > (1 << 20)) return 0;
  size_t n = (size_t)len < max ? (size_t)len : max;
  return rd(dst, hek + PL536_HEK_KEY, n) ? n : 0;
}

/* A C string (a COP's file), its last max bytes at most: read up to the end of its page
 * first, so that a string near the end of a mapping is read too. */
static size_t cstr_bytes(uintptr_t s, char *dst, size_t max) {
  char buf[512];
  size_t have = 0;
  while (have < sizeof buf) {
    size_t page_left = 4096 - ((s + have) & 4095), want = sizeof buf - have;
    if (want > page_left) want = page_left;
    if (!rd(buf + have, s + have, want)) break;
    char *z = memchr(buf + have, 0, want);
    if (z) { have = (size_t)(z - buf); goto found; }
    have += want;
  }
  return 0; /* no end found */
found:
  if (have > max) { memcpy(dst, buf + have - max, max); return max; }
  memcpy(dst, buf, have);
  return have;
}
