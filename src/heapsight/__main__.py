"""`python -m heapsight` and the `heapsight` console script."""

import sys

from heapsight import interrupts

# before anything else: a SIGUSR1, SIGUSR2 or SIGALRM sent to heapsight never ends it
interrupts.hold_passed_on()

from heapsight.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
