"""`python -m heapsight` and the `heapsight` console script."""

import os
import sys

from heapsight import interrupts, limits

# before anything else: a SIGUSR1, SIGUSR2 or SIGALRM sent to heapsight never ends it
interrupts.hold_passed_on()
# and room for heapsight's own files under a low inherited open-files limit (the program
# gets the limit heapsight was given: live/launch.py)
limits.room_for_files()

from heapsight.cli import main  # noqa: E402

COPY_END_S = 2.0   # a copy's page tables freed: tens of ms for 500 MiB


def run_main() -> int:
    """The console script: main(), then, when `heapsight run`'s program died of a signal,
    the same death for heapsight (interrupts.die_as); else the exit, without the
    interpreter's teardown (exit_now)."""
    rc = main()
    copies = sys.modules.get("heapsight.live.heapmaps")
    if copies is not None:   # the exit's copy, its map read, may still be ending
        copies.reap_ending(COPY_END_S)
    if interrupts.program_signal:
        interrupts.die_as(interrupts.program_signal)
    exit_now(rc)
    return rc


def exit_now(rc: int) -> None:
    """Ends heapsight once everything it had to say is written: its exit handlers run (the
    symbolizer's processes closed, temporary files removed), stdout and stderr flushed, then
    the process ends without the interpreter tearing down every module it imported (numpy's,
    the analysis': 35 ms of a run's wall here, bench/startup). Returns, for the ordinary
    exit, when a thread of heapsight's that is not a daemon still runs (its end is waited
    for) or when the streams cannot be flushed (the exit then reports it as it does)."""
    import atexit
    import threading
    if any(t is not threading.current_thread() and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            return
    os._exit(rc if isinstance(rc, int) and 0 <= rc <= 255 else 1)


if __name__ == "__main__":
    sys.exit(run_main())
