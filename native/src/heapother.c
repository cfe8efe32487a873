/* heapother.c: the heap map's pages under another allocator than glibc (jemalloc, tcmalloc,
 * mimalloc), in the copy. Their extents, spans and pages are not walked (each version lays
 * them out its own way); what the hooks recorded is read instead: the mappings the
 * allocator made (blockmap.c's list, by the calling object) are the map's heaps, and the
 * live blocks (the record of block starts, sizes from the allocator's malloc_usable_size)
 * give each page its live bytes. The residency before and after the release comes from
 * pagemap as for glibc's heaps. So a page resident after the release with few live bytes
 * is pinned under any allocator, and the pinners are named from the sampled blocks on it;
 * an allocator's free lists and its own metadata are not told apart (both are pages with
 * no live byte). */
#define _GNU_SOURCE
#include <string.h>

#include "heapmap_copy.h"

/* The allocator's mappings as heaps (kind HS_HEAP_ALLOCATOR), in address order, adjacent
 * ones joined, each cut to what is mapped now; at most HS_OTHER_PAGES_MAX pages in all.
 * 1 when there is a heap to map; 0 (why says why) when not. */
int _hs_other_heaps(child_t *c, const char **why) {
  hs_chunk_t *r = _hs_copy_map(HS_ALLOC_RANGES_MAX * sizeof *r, 0);
  if (!r) {
    *why = "no room in the copy for the allocator's mappings";
    return 0;
  }
  long n = _hs_blockmap_ranges(r, HS_ALLOC_RANGES_MAX);
  if (n <= 0) {
    *why = n < 0 ? "the allocator made more mappings than heapsight keeps a list of"
                 : "no mapping of the allocator's was recorded";
    return 0;
  }
  _hs_reach_sort(r, (size_t)n);
  /* joined, and cut to the copy's own mappings (a range the allocator unmapped in part) */
  heap_t *heaps = _hs_copy_map(((size_t)n + c->n_maps) * sizeof *heaps, 0);
  if (!heaps) {
    *why = "no room in the copy for the allocator's mappings";
    return 0;
  }
  size_t k = 0, m0 = 0;
  uint64_t pages = 0;
  for (long i = 0; i < n;) {
    uint64_t lo = r[i].lo, hi = r[i].hi;
    for (i++; i < n && r[i].lo <= hi; i++) hi = r[i].hi > hi ? r[i].hi : hi;
    while (m0 < c->n_maps && c->maps[m0].hi <= lo) m0++; /* both in address order */
    for (size_t m = m0; m < c->n_maps && c->maps[m].lo < hi; m++) {
      const map_t *mp = &c->maps[m];
      /* in whole pages (an sbrk's increment need not be one), inside the mapping */
      uint64_t a = (lo & ~(c->page - 1)) > mp->lo ? lo & ~(c->page - 1) : mp->lo;
      uint64_t up = (hi + c->page - 1) & ~(c->page - 1), b = up < mp->hi ? up : mp->hi;
      if (a >= b || !(mp->anon || mp->heap) || mp->shared) continue;
      if (k && heaps[k - 1].end == a) { heaps[k - 1].end = b; continue; }
      heaps[k].start = a;
      heaps[k].end = b;
      heaps[k].kind = HS_HEAP_ALLOCATOR;
      k++;
    }
  }
  for (size_t i = 0; i < k; i++) pages += (heaps[i].end - heaps[i].start) / c->page;
  if (!k || pages > HS_OTHER_PAGES_MAX) {
    *why = k ? "the allocator's mappings span more than 64 GiB: their pages are not mapped"
             : "none of the allocator's mappings is mapped now";
    return 0;
  }
  c->heaps = heaps;
  c->n_heaps = k;
  return 1;
}

/* Each page's live bytes from the blocks (c->chunks, in address order: blockmap.c lists
 * them so), a block's bytes on each page it spans; blocks outside the heaps (heapsight's
 * own start-up pool) are left out. */
void _hs_other_live(child_t *c) {
  size_t h = 0;
  for (size_t i = 0; i < c->n_chunks; i++) {
    uint64_t lo = c->chunks[i].lo, hi = c->chunks[i].hi;
    while (h < c->n_heaps && c->heaps[h].end <= lo) h++;
    if (h == c->n_heaps) break;
    heap_t *hp = &c->heaps[h];
    if (lo < hp->start || hi > hp->start + hp->out.pages * c->page) continue;
    hp->out.live_bytes += hi - lo;
    hp->out.inuse_chunks++;
    for (uint64_t at = lo; at < hi;) {
      uint64_t page = (at - hp->start) >> __builtin_ctzll(c->page); /* a power of two */
      uint64_t page_end = hp->start + (page + 1) * c->page;
      uint64_t end = hi < page_end ? hi : page_end;
      hp->live[page] += (uint32_t)(end - at);
      at = end;
    }
  }
  for (size_t i = 0; i < c->n_heaps; i++) c->heaps[i].out.walked = 1;
}
