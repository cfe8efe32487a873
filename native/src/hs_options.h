/* hs_options.h: settings read once from HEAPSIGHT_* variables (options.c). */
#ifndef HS_OPTIONS_H
#define HS_OPTIONS_H
typedef struct hs_options_s {
  double stats_hz;      /* HEAPSIGHT_STATS_HZ: allocator statistics per second (0: off) */
  int release_at_exit;  /* HEAPSIGHT_RELEASE_AT_EXIT: measure a release at exit */
} hs_options_t;
extern hs_options_t _hs_opt;
void _hs_options_read(void);
#endif
