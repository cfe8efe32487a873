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
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "hs_internal.h"

/* ---- CPython 3.11 (x86-64/aarch64, LP64) ---- */
#define PY311_TSTATE_CFRAME 56         /* PyThreadState.cframe */
#define PY311_CFRAME_CURRENT 8         /* _PyCFrame.current_frame */
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
  if (eval) {
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
struct lt { uintptr_t at, end; unsigned char buf[256]; size_t have, pos; int bad; };

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

/* The line of the instruction at byte offset addrq (PyCode_Addr2Line), -1 for none. */
static int line_of(uintptr_t table, int64_t len, int first, int64_t addrq) {
  if (addrq < 0) return first;
  struct lt t = {table, table + (uintptr_t)len, {0}, 0, 0, 0};
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

/* This thread's Python frames, innermost first: at most max. */
int _hs_interp_frames(hs_iframe_t *out, int max) {
  if (!_hs_interp_ready()) return 0;
  uintptr_t ts = (uintptr_t)g_this_tstate(), cframe = 0, cur = 0;
  if (!ts || !rd(&cframe, ts + PY311_TSTATE_CFRAME, 8) || !rd(&cur, cframe + PY311_CFRAME_CURRENT, 8))
    return 0;
  int n = 0;
  for (int depth = 0; cur && n < max && depth < HS_INTERP_DEPTH * 2; depth++) {
    unsigned char fr[PY311_FRAME_BYTES], co[PY311_CODE_ADAPTIVE], lt[PY_BYTES_SVAL];
    if (!rd(fr, cur, sizeof fr)) break;
    uintptr_t code = u64(fr, PY311_FRAME_CODE);
    if (!rd(co, code, sizeof co) || u64(co, PY_OB_TYPE) != g_code_type) break;
    int64_t units = (int64_t)u64(co, PY_OB_SIZE);
    int64_t addrq = (int64_t)(u64(fr, PY311_FRAME_PREV_INSTR) - (code + PY311_CODE_ADAPTIVE));
    int owner = fr[PY311_FRAME_OWNER], first = i32(co, PY311_CODE_FIRSTLINENO);
    hs_iframe_t *f = &out[n++];
    f->code = code;
    f->name = u64(co, PY311_CODE_QUALNAME);
    f->file = u64(co, PY311_CODE_FILENAME);
    f->entry = fr[PY311_FRAME_IS_ENTRY] != 0;
    /* _PyFrame_IsIncomplete: pushed, not started (its line is not meaningful) */
    f->skip = owner != PY311_OWNED_BY_GENERATOR &&
              addrq < (int64_t)i32(co, PY311_CODE_FIRSTTRACEABLE) * 2;
    f->line = first;
    uintptr_t table = u64(co, PY311_CODE_LINETABLE);
    if (!f->skip && addrq < units * 2 && rd(lt, table, sizeof lt) &&
        u64(lt, PY_OB_TYPE) == g_bytes_type) {
      int64_t len = (int64_t)u64(lt, PY_OB_SIZE);
      if (len > 0 && len < (1 << 24)) {
        int line = line_of(table + PY_BYTES_SVAL, len, first, addrq);
        if (line >= 0) f->line = line;
      }
    }
    cur = u64(fr, PY311_FRAME_PREVIOUS);
  }
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
