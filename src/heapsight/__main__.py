"""`python -m heapsight` and the `heapsight` console script."""

import sys

from heapsight.cli import main

if __name__ == "__main__":
    sys.exit(main())
