"""Every file heapsight writes goes through here: checked before any long work, written
whole or not at all, never replacing what heapsight did not create.

- A regular file (or a new path) is written to a unique temporary file in the same
  directory, flushed to disk and renamed over the target: a reader never sees half a file,
  and two heapsight processes writing the same path never share a temporary name.
- A special file (a device such as /dev/null, a FIFO, a socket) is opened and written
  directly, never replaced. A symlink is followed: its target is written.
- Files heapsight creates are mode 0600: a record holds the whole command line, which may
  carry secrets. A file that is replaced keeps no more than that either.
- Ctrl-C, SIGTERM and SIGHUP wait while a file is written (then take effect): an
  interrupt never loses a finished run and never leaves a temporary file behind.
"""

from __future__ import annotations

import gzip as gzip_module
import json
import os
import stat
import sys
import tempfile

from heapsight import interrupts
from heapsight.errors import HeapsightError


def _special(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check(path: str, option: str, allow_stdout: bool = False) -> None:
    """Refuses an output path that cannot be written, before any work is done: one line
    naming the option, the path, the problem and the fix (exit code 2)."""
    if path == "-":
        if allow_stdout:
            return
        raise HeapsightError(f"{option} -: this output cannot go to stdout; give a file name")
    if not path:
        raise HeapsightError(f"{option}: the file name is empty")
    target = os.path.realpath(path)
    if os.path.isdir(target):
        raise HeapsightError(f"{option} {path} is a directory: give a file name inside it, "
                             f"e.g. {os.path.join(path, 'out')}")
    if _special(target):
        if not os.access(target, os.W_OK):
            raise HeapsightError(f"{option} {path}: not writable (permission denied)")
        return
    parent = os.path.dirname(target) or "."
    if not os.path.isdir(parent):
        raise HeapsightError(f"{option} {path}: directory {parent} does not exist (create it, "
                             "or give another path)")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(target) and
                                                    not os.access(target, os.W_OK)):
        raise HeapsightError(f"{option} {path}: not writable (permission denied); give a path "
                             "in a directory you can write")
    try:   # a read-only file system, which access() does not see
        fd, probe = tempfile.mkstemp(prefix=".heapsight-check-", dir=parent)
    except OSError as e:
        raise HeapsightError(f"{option} {path}: cannot write in {parent} ({e.strerror})") from e
    os.close(fd)
    os.unlink(probe)


def write(path: str, data: bytes | str, *, gzip: bool | None = None) -> None:
    """Writes data to path ('-': stdout) whole or not at all; gzip by the .gz suffix when
    gzip is None. Raises HeapsightError (exit 1) when it cannot."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if gzip is None:
        gzip = path.endswith(".gz")
    if gzip:
        data = gzip_module.compress(data, compresslevel=6, mtime=0)
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    with interrupts.deferred():
        target = os.path.realpath(path)
        if _special(target):
            try:
                with open(target, "wb") as f:
                    f.write(data)
            except OSError as e:
                raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
            return
        parent = os.path.dirname(target) or "."
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                                       dir=parent)
            with os.fdopen(fd, "wb") as f:   # mkstemp makes it 0600
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            tmp = None
        except OSError as e:
            raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def write_json(path: str, doc: dict, indent: int | None = 2) -> None:
    """JSON to path ('-': stdout); strings that hold undecodable bytes (surrogate escapes)
    are written as \\udcXX escapes, which load back as the same strings."""
    seps = (",", ":") if indent is None else None
    write(path, json.dumps(doc, indent=indent, separators=seps, allow_nan=False) + "\n",
          gzip=False if path == "-" else None)


def save_doc(path: str, doc: dict) -> None:
    """A saved document (run record, comparison, lab results): compact JSON, gzip'd when
    the name ends in .gz."""
    write(path, json.dumps(doc, separators=(",", ":"), allow_nan=False))
