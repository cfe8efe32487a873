"""`python -m heapsight` and the `heapsight` console script."""

import sys

from heapsight import interrupts, limits

# before anything else: a SIGUSR1, SIGUSR2 or SIGALRM sent to heapsight never ends it
interrupts.hold_passed_on()
# and room for heapsight's own files under a low inherited open-files limit (the program
# gets the limit heapsight was given: live/launch.py)
limits.room_for_files()

from heapsight.cli import main  # noqa: E402


def run_main() -> int:
    """The console script: main(), then, when `heapsight run`'s program died of a signal,
    the same death for heapsight (interrupts.die_as)."""
    rc = main()
    if interrupts.program_signal:
        interrupts.die_as(interrupts.program_signal)
    return rc


if __name__ == "__main__":
    sys.exit(run_main())
