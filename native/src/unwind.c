/* unwind.c: the stack at a sample, from unwind rules cached per return address (x86-64).
 *
 * libgcc's _Unwind_Backtrace works out every frame anew: it finds the frame's FDE, runs
 * its CIE's and its own call-frame program, and builds a full register context, about
 * 2,000 instructions a frame (a perl sample: 17,000). Yet a frame's rule at a given return
 * address never changes: where the caller's frame starts (the CFA: the stack pointer or the
 * frame pointer plus an offset), and where the frame pointer was saved. This file reads that
 * rule once per return address from the same FDE (libgcc's _Unwind_Find_FDE finds it, with
 * no lock on glibc 2.35+), keeps it in a table, and walks with it: two loads a frame.
 *
 * Only the rules a compiler writes for ordinary code are cached: the CFA is rsp or rbp plus
 * an offset, the return address sits just below it, and rbp is either kept or saved at a
 * fixed offset from it. Anything else (a signal frame, a CFA given by an expression as in
 * a stack-realigning function or a PLT entry, another register as the CFA, a 64-bit FDE)
 * makes the walk give up, and profile.c unwinds that sample with libgcc, as before.
 *
 * The table is insert-only (a rule, once there, is never changed or removed), so readers
 * take no lock: a key is published after its rule. A dlclose may unmap code whose rules are
 * in the table, and a library loaded at its address later would find them: a dlclose puts
 * a new, empty table in its place (_hs_unwind_forget; the old one stays mapped, as a walk
 * may still be reading it), four times at most, then the cached walk is off. With
 * HEAPSIGHT_UNWIND_CHECK=1 every sample is unwound both ways and differences are counted
 * (hs_profile_t.unwind_mismatches), which the tests read. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "hs_internal.h"

struct hs_eh_bases { void *tbase, *dbase, *func; };
typedef const void *(*hs_find_fde_fn)(void *pc, struct hs_eh_bases *bases);

static hs_find_fde_fn g_find_fde;
static int g_on;        /* atomic: 1 while the cached walk may be used */

/* A rule, packed in one word: the CFA offset (bits 0-31), where rbp was saved, from the
 * CFA (32-47), and flags. 0 is never a rule (a CFA offset is at least 8). */
#define R_CFA_RBP (1ull << 48)   /* the CFA is rbp + offset (else rsp + offset) */
#define R_RBP_SAVED (1ull << 49) /* rbp was saved at CFA + its offset (else unchanged) */
#define R_END (1ull << 50)       /* the return address is undefined: the outermost frame */
#define R_CANNOT (1ull << 51)    /* a rule this walk does not follow: libgcc's */

#define TABLE_SIZE 4096          /* return addresses: 64 KiB, mapped at start */
typedef struct { uint64_t key, rule; } entry_t;
static entry_t *g_table;
static int g_table_lock;
static uint32_t g_table_used;
static uint16_t g_table_pages; /* the table's pages written: heapsight's memory (16 of them) */

static uint64_t table_get(uint64_t key) {
  entry_t *t = __atomic_load_n(&g_table, __ATOMIC_ACQUIRE);
  if (!t) return 0;
  for (uint64_t j = mix64(key) & (TABLE_SIZE - 1), n = 0; n < 16; j = (j + 1) & (TABLE_SIZE - 1), n++) {
    uint64_t k = __atomic_load_n(&t[j].key, __ATOMIC_ACQUIRE);
    if (k == key) return t[j].rule;
    if (k == 0) return 0;
  }
  return 0;
}

static void table_put(uint64_t key, uint64_t rule) {
  if (__atomic_exchange_n(&g_table_lock, 1, __ATOMIC_ACQUIRE)) return; /* busy: next time */
  entry_t *t = g_table;
  if (!t || g_table_used >= TABLE_SIZE / 2) { /* full: found anew each time */
    __atomic_store_n(&g_table_lock, 0, __ATOMIC_RELEASE);
    return;
  }
  for (uint64_t j = mix64(key) & (TABLE_SIZE - 1), n = 0; n < 16; j = (j + 1) & (TABLE_SIZE - 1), n++) {
    if (t[j].key == key) break;
    if (t[j].key == 0) {
      t[j].rule = rule;
      __atomic_store_n(&t[j].key, key, __ATOMIC_RELEASE);
      g_table_used++;
      unsigned page = (unsigned)(j * sizeof(entry_t) / 4096);
      if (!(g_table_pages & (1u << page))) {
        g_table_pages |= (uint16_t)(1u << page);
        _hs_own_memory(4096);
      }
      break;
    }
  }
  __atomic_store_n(&g_table_lock, 0, __ATOMIC_RELEASE);
}

/* ---- reading the call-frame information (DWARF 4, section 6.4; .eh_frame's form) ---- */

static uint64_t uleb(const uint8_t **p, const uint8_t *end) {
  uint64_t v = 0;
  for (unsigned shift = 0; *p < end && shift < 64; shift += 7) {
    uint8_t b = *(*p)++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) break;
  }
  return v;
}

static int64_t sleb(const uint8_t **p, const uint8_t *end) {
  int64_t v = 0;
  unsigned shift = 0;
  uint8_t b = 0;
  while (*p < end && shift < 64) {
    b = *(*p)++;
    v |= (int64_t)(b & 0x7f) << shift;
    shift += 7;
    if (!(b & 0x80)) break;
  }
  if (shift < 64 && (b & 0x40)) v |= -((int64_t)1 << shift);
  return v;
}

/* The bytes of a pointer in this encoding (DW_EH_PE_*, its low 4 bits); 0: not known. */
static unsigned encoded_size(uint8_t enc) {
  switch (enc & 0x0f) {
    case 0x00: return 8;             /* absptr */
    case 0x02: case 0x0a: return 2;  /* udata2, sdata2 */
    case 0x03: case 0x0b: return 4;  /* udata4, sdata4 */
    case 0x04: case 0x0c: return 8;  /* udata8, sdata8 */
    default: return 0;               /* uleb128 and the rest */
  }
}

typedef struct {
  int cfa_rbp;         /* the CFA is rbp + cfa_off (else rsp + cfa_off) */
  int64_t cfa_off;
  int rbp_saved;       /* rbp at CFA + rbp_off (else unchanged) */
  int64_t rbp_off;
  int ra_undefined;
  int cannot;
} state_t;

typedef struct {
  const uint8_t *insns, *end;
  uint64_t caf;        /* code alignment factor */
  int64_t daf;         /* data alignment factor */
  uint8_t fde_enc;
  int ok;
} cie_t;

enum { REG_RBP = 6, REG_RSP = 7, REG_RA = 16 };

static void read_cie(const uint8_t *c, cie_t *out) {
  out->ok = 0;
  uint32_t len;
  memcpy(&len, c, 4);
  if (len == 0 || len == 0xffffffffu) return; /* 64-bit form: not followed */
  const uint8_t *end = c + 4 + len, *p = c + 8;
  uint8_t version = *p++;
  const char *aug = (const char *)p;
  while (p < end && *p) p++;
  p++;
  out->caf = uleb(&p, end);
  out->daf = sleb(&p, end);
  uint64_t ra = version == 1 ? *p++ : uleb(&p, end);
  if (ra != REG_RA) return;
  out->fde_enc = 0;
  if (aug[0] == 'z') {
    uint64_t alen = uleb(&p, end);
    const uint8_t *a = p;
    for (const char *k = aug + 1; *k; k++) {
      if (*k == 'R') out->fde_enc = *a++;
      else if (*k == 'L') a++;
      else if (*k == 'P') {
        unsigned n = encoded_size(*a++);
        if (!n) return;
        a += n;
      } else {
        return; /* 'S' (a signal frame) and anything else: libgcc's */
      }
    }
    p += alen;
  } else if (aug[0]) {
    return;
  }
  if (p > end || !encoded_size(out->fde_enc)) return;
  out->insns = p;
  out->end = end;
  out->ok = 1;
}

/* Runs a call-frame program up to `target` (the rules in force at that address). */
static void run(state_t *s, const state_t *initial, const cie_t *cie, const uint8_t *p,
                const uint8_t *end, uint64_t loc, uint64_t target) {
  state_t saved[8];
  int depth = 0;
  while (p < end && !s->cannot) {
    uint8_t op = *p++, low = op & 0x3f;
    uint64_t reg = 0, delta = 0;
    int64_t off = 0;
    switch (op & 0xc0) {
      case 0x40: /* advance_loc */
        loc += low * cie->caf;
        if (loc > target) return;
        continue;
      case 0x80: /* offset */
        off = (int64_t)uleb(&p, end) * cie->daf;
        if (low == REG_RBP) { s->rbp_saved = 1; s->rbp_off = off; }
        else if (low == REG_RA && off != -8) s->cannot = 1;
        continue;
      case 0xc0: /* restore */
        if (low == REG_RBP) { s->rbp_saved = initial->rbp_saved; s->rbp_off = initial->rbp_off; }
        continue;
    }
    switch (op) {
      case 0x00: break; /* nop */
      case 0x02: delta = *p++; goto advance;
      case 0x03: { uint16_t d; memcpy(&d, p, 2); p += 2; delta = d; goto advance; }
      case 0x04: { uint32_t d; memcpy(&d, p, 4); p += 4; delta = d; goto advance; }
      advance:
        loc += delta * cie->caf;
        if (loc > target) return;
        break;
      case 0x05: /* offset_extended */
        reg = uleb(&p, end);
        off = (int64_t)uleb(&p, end) * cie->daf;
        goto offset;
      case 0x11: /* offset_extended_sf */
        reg = uleb(&p, end);
        off = sleb(&p, end) * cie->daf;
        goto offset;
      case 0x2f: /* GNU_negative_offset_extended */
        reg = uleb(&p, end);
        off = -(int64_t)uleb(&p, end) * cie->daf;
      offset:
        if (reg == REG_RBP) { s->rbp_saved = 1; s->rbp_off = off; }
        else if (reg == REG_RA && off != -8) s->cannot = 1;
        break;
      case 0x06: /* restore_extended */
        reg = uleb(&p, end);
        if (reg == REG_RBP) { s->rbp_saved = initial->rbp_saved; s->rbp_off = initial->rbp_off; }
        break;
      case 0x07: /* undefined */
        reg = uleb(&p, end);
        if (reg == REG_RA) s->ra_undefined = 1;
        else if (reg == REG_RBP) s->cannot = 1;
        break;
      case 0x08: /* same_value */
        reg = uleb(&p, end);
        if (reg == REG_RBP) s->rbp_saved = 0;
        else if (reg == REG_RA) s->cannot = 1;
        break;
      case 0x09: /* register */
        reg = uleb(&p, end);
        (void)uleb(&p, end);
        if (reg == REG_RBP || reg == REG_RA) s->cannot = 1;
        break;
      case 0x0a: /* remember_state */
        if (depth == 8) { s->cannot = 1; break; }
        saved[depth++] = *s;
        break;
      case 0x0b: /* restore_state */
        if (depth == 0) { s->cannot = 1; break; }
        *s = saved[--depth];
        break;
      case 0x0c: /* def_cfa */
        reg = uleb(&p, end);
        s->cfa_off = (int64_t)uleb(&p, end);
        goto cfa_reg;
      case 0x12: /* def_cfa_sf */
        reg = uleb(&p, end);
        s->cfa_off = sleb(&p, end) * cie->daf;
        goto cfa_reg;
      case 0x0d: /* def_cfa_register */
        reg = uleb(&p, end);
      cfa_reg:
        if (reg == REG_RSP) s->cfa_rbp = 0;
        else if (reg == REG_RBP) s->cfa_rbp = 1;
        else s->cannot = 1;
        break;
      case 0x0e: /* def_cfa_offset */
        s->cfa_off = (int64_t)uleb(&p, end);
        break;
      case 0x13: /* def_cfa_offset_sf */
        s->cfa_off = sleb(&p, end) * cie->daf;
        break;
      case 0x10: case 0x14: case 0x15: case 0x16: /* expression, val_offset(_sf), val_expression */
        reg = uleb(&p, end);
        if (op == 0x14) (void)uleb(&p, end);
        else if (op == 0x15) (void)sleb(&p, end);
        else p += uleb(&p, end);
        if (reg == REG_RBP || reg == REG_RA) s->cannot = 1;
        break;
      case 0x2e: /* GNU_args_size */
        (void)uleb(&p, end);
        break;
      default: /* def_cfa_expression (0x0f), set_loc, and anything not known */
        s->cannot = 1;
        break;
    }
  }
}

/* The rule at `target`, an address in code: its FDE read from the start. */
static uint64_t rule_at(uintptr_t target) {
  struct hs_eh_bases bases = {0, 0, 0};
  const uint8_t *fde = g_find_fde((void *)target, &bases);
  if (!fde) return R_END; /* no FDE: libgcc ends the stack there too */
  uint32_t len, cie_off;
  memcpy(&len, fde, 4);
  memcpy(&cie_off, fde + 4, 4);
  if (len == 0xffffffffu || cie_off == 0) return R_CANNOT;
  cie_t cie;
  read_cie(fde + 4 - cie_off, &cie);
  if (!cie.ok) return R_CANNOT;
  const uint8_t *end = fde + 4 + len, *p = fde + 8;
  unsigned n = encoded_size(cie.fde_enc);
  p += 2 * n; /* pc_begin (bases.func has it decoded) and pc_range */
  if (p > end) return R_CANNOT;
  p += uleb(&p, end); /* the augmentation data ('z' is always there with 'R') */
  state_t initial = {0, 8, 0, 0, 0, 0};
  run(&initial, &initial, &cie, cie.insns, cie.end, 0, 0);
  state_t s = initial;
  run(&s, &initial, &cie, p, end, (uint64_t)(uintptr_t)bases.func, target);
  if (s.cannot || s.cfa_off < 8 || s.cfa_off > INT32_MAX || (s.rbp_saved && (s.rbp_off < -32768 || s.rbp_off > 32767)))
    return R_CANNOT;
  if (s.ra_undefined) return R_END;
  return (uint64_t)(uint32_t)s.cfa_off | (uint64_t)(uint16_t)(int16_t)s.rbp_off << 32 |
         (s.cfa_rbp ? R_CFA_RBP : 0) | (s.rbp_saved ? R_RBP_SAVED : 0);
}

static uint64_t rule_for(uintptr_t target) {
  uint64_t r = table_get(target);
  if (r) return r;
  r = rule_at(target);
  table_put(target, r);
  return r;
}

/* An empty table in place of the current one (kept mapped: a walk may be reading it). */
static int new_table(void) {
  entry_t *t = _hs_raw_mmap(TABLE_SIZE * sizeof(entry_t));
  if (!t) return 0;
  while (__atomic_exchange_n(&g_table_lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
  g_table_used = 0;
  g_table_pages = 0; /* the old table's pages stay counted: still resident */
  __atomic_store_n(&g_table, t, __ATOMIC_RELEASE);
  __atomic_store_n(&g_table_lock, 0, __ATOMIC_RELEASE);
  return 1;
}

void _hs_unwind_start(void *gcc) {
  g_find_fde = gcc ? (hs_find_fde_fn)dlsym(gcc, "_Unwind_Find_FDE") : NULL;
  if (!g_find_fde) return;
  if (new_table()) __atomic_store_n(&g_on, 1, __ATOMIC_RELEASE);
}

/* After a dlclose: a new table, or after four, no cached walk at all. */
void _hs_unwind_forget(void) {
  static int swaps;
  if (!__atomic_load_n(&g_on, __ATOMIC_ACQUIRE)) return;
  if (__atomic_add_fetch(&swaps, 1, __ATOMIC_RELAXED) > 4 || !new_table())
    __atomic_store_n(&g_on, 0, __ATOMIC_RELEASE);
}

int _hs_unwind_ready(void) { return __atomic_load_n(&g_on, __ATOMIC_ACQUIRE); }

/* The table's mapping, for the reachability walk's list of heapsight's own memory. */
size_t _hs_unwind_own(hs_chunk_t *out, size_t max) {
  entry_t *t = __atomic_load_n(&g_table, __ATOMIC_ACQUIRE);
  if (!t || max == 0) return 0;
  out[0].lo = (uint64_t)(uintptr_t)t;
  out[0].hi = out[0].lo + TABLE_SIZE * sizeof(entry_t);
  return 1;
}

/* The return addresses of the stack from the caller's caller of this function on,
 * innermost first, those inside [skip_lo, skip_hi) left out (heapsight's own frames: its
 * hooks at the start, the main of its own that calls the program's at the end); -1 when a frame's rule is not one this walk follows (the caller unwinds with
 * libgcc). */
__attribute__((noinline)) int _hs_unwind_fast(uint64_t *out, int max, uintptr_t skip_lo,
                                               uintptr_t skip_hi) {
  uintptr_t pc, sp, bp;
  __asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
                   : "=r"(pc), "=r"(sp), "=r"(bp));
  int n = 0;
  uintptr_t target = pc; /* the first frame's own address; a return address less 1 after */
  for (int depth = 0; depth < 256; depth++) {
    uint64_t r = rule_for(target);
    if (r & R_CANNOT) return -1;
    if (r & R_END) return n;
    uintptr_t cfa = ((r & R_CFA_RBP) ? bp : sp) + (uint32_t)r;
    if (cfa <= sp || cfa - sp > (64u << 20) || (cfa & 7)) return -1; /* not a stack: libgcc */
    uintptr_t ra = *(const uintptr_t *)(cfa - 8);
    if (r & R_RBP_SAVED) bp = *(const uintptr_t *)(cfa + (int64_t)(int16_t)(r >> 32));
    sp = cfa;
    if (ra == 0) return n;
    if (ra >= skip_lo && ra < skip_hi) { target = ra - 1; continue; }
    out[n++] = ra;
    if (n == max) return n;
    target = ra - 1;
  }
  return n;
}
