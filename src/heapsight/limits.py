"""The resource limits heapsight was started with: the program gets them as they were,
whatever heapsight raises for itself (live/launch.py gives them back)."""

from __future__ import annotations

import contextlib


# The open-files limit heapsight was started with, when it had to raise it for itself
# (room_for_files); the program is given this one back (live/launch.py).
START_NOFILE: tuple | None = None
FILES_NEEDED = 64   # heapsight's own: its modules, /proc files, pipes to gdb and the symbolizer


def room_for_files() -> None:
    """Raises heapsight's own soft limit on open files to FILES_NEEDED when it was started
    with less (ulimit -n 4: Python could not even import its modules), remembering the
    limit to give the program. Below what heapsight needs and cannot raise (a hard limit
    that low): one line saying so, exit 1."""
    import resource
    import sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= FILES_NEEDED:
        return
    want = FILES_NEEDED if hard == resource.RLIM_INFINITY else min(FILES_NEEDED, hard)
    if want < 16:
        sys.stderr.write(f"heapsight: error: the open-files limit is {soft} (hard {hard}): "
                         f"heapsight needs {FILES_NEEDED} for its own files; raise it (ulimit -n "
                         f"{FILES_NEEDED}) and the program still gets the limit it is given\n")
        sys.exit(1)
    global START_NOFILE
    START_NOFILE = (soft, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextlib.contextmanager
def given_to_children():
    """Around a spawn: heapsight's soft open-files limit is the one it was started with,
    so that the child inherits it; heapsight's own is raised again after. (Its open files
    stay open: a limit only bounds new ones.) Nothing when heapsight raised none."""
    if START_NOFILE is None:
        yield
        return
    import resource
    mine = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, START_NOFILE)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, mine)
