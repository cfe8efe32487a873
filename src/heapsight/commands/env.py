"""Print the environment that runs a program with heapsight's library, for a service
started without `heapsight run` (a systemd unit, a container's entry point).

The program then counts its allocations as under `heapsight run` and keeps the counts in
a segment of its own (/dev/shm/heapsight-PID-auto.seg, removed at its exit), which
`heapsight attach PID` reads: exact live bytes and rounding waste, no gdb needed for them.
The cost is the library's (see bench/overhead).

examples:
  eval "$(heapsight env)" && exec ./server          # a shell entry point
  heapsight env --systemd > /etc/systemd/system/app.service.d/heapsight.conf
  heapsight attach "$(pidof server)"
"""

from __future__ import annotations

import shlex
import sys

from heapsight import native

USAGE = "heapsight env [--systemd]"


def add_arguments(p) -> None:
    p.add_argument("--systemd", action="store_true",
                   help="print a [Service] section with Environment= lines (a drop-in)")


def execute(args) -> int:
    lib = str(native.preload_library())
    if args.systemd:
        sys.stdout.write(f"[Service]\nEnvironment=LD_PRELOAD={lib}\nEnvironment=HEAPSIGHT_SEGMENT=auto\n")
    else:
        sys.stdout.write(f"export LD_PRELOAD={shlex.quote(lib)}${{LD_PRELOAD:+:$LD_PRELOAD}}\n"
                         "export HEAPSIGHT_SEGMENT=auto\n")
    return 0
