/* heapsight_snapshot.h: ask heapsight for a snapshot of the program's memory, from the
 * program, at the moment that matters ("after loading", "batch 10 done").
 *
 *   #include "heapsight_snapshot.h"
 *   ...
 *   heapsight_snapshot("after load");   // nothing happens when heapsight is not running
 *
 * The function lives in libheapsight.so, which `heapsight run` preloads. The declaration is
 * weak, so a program built with this header links and runs without heapsight: the macro
 * calls the function only when the dynamic loader found it. Returns 1 when the snapshot was
 * taken (the call waits up to 200 ms for heapsight's sampler to take it), 0 otherwise.
 * Calls made at the same time (from several threads) may be answered by one snapshot: each
 * returns 1, the snapshot has the label of one of them and says how many more it answered.
 *
 * From Python (ctypes), with the same effect and the same safety:
 *   import ctypes
 *   snap = getattr(ctypes.CDLL(None), "heapsight_snapshot", None)
 *   if snap:
 *       snap(b"after load")
 */
#ifndef HEAPSIGHT_SNAPSHOT_H
#define HEAPSIGHT_SNAPSHOT_H

#ifdef __cplusplus
extern "C" {
#endif

extern int heapsight_snapshot(const char *label) __attribute__((weak));

#define HEAPSIGHT_SNAPSHOT(label) (heapsight_snapshot ? heapsight_snapshot(label) : 0)

#ifdef __cplusplus
}
#endif

#endif
