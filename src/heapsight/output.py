"""Every file heapsight writes goes through here: checked before any long work, written
whole or not at all, never replacing what heapsight did not create.

- A regular file (or a new path) is written to a unique temporary file in the same
  directory, flushed to disk and renamed over the target: a reader never sees half a file,
  and two heapsight processes writing the same path never share a temporary name.
- A special file (a device such as /dev/null, or a FIFO) is opened and written directly,
  never replaced. A symlink is followed: its target is written, the link stays.
- Files heapsight creates are mode 0600: a record holds the whole command line, which may
  carry secrets. A file that is replaced becomes 0600 too (it is a new file renamed over
  the old one), whatever mode the old one had.
- Ctrl-C, SIGTERM and SIGHUP wait while a file is written (then take effect): an
  interrupt never loses a finished run and never leaves a temporary file behind. A
  special file has no temporary file to protect: a FIFO nobody reads gives up its wait
  at Ctrl-C, even where the caller defers interrupts.
- A socket is refused: heapsight cannot open one as a file.
"""

from __future__ import annotations

import errno
import gzip as gzip_module
import json
import os
import re
import signal
import stat
import sys
import tempfile
import time

from heapsight import interrupts
from heapsight.errors import HeapsightError


# Lone surrogates that are not surrogate-escaped bytes (those are U+DC80..U+DCFF).
OTHER_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")
TEMP_STEM_CHARS = 40   # of the target's name in its temporary file's: any valid name fits
FIFO_POLL_S = 0.05     # how often a FIFO is tried for a reader


def _special(path: str) -> bool:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _temp_prefix(target: str) -> str:
    return f".{os.path.basename(target)[:TEMP_STEM_CHARS]}."


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
    parent = os.path.dirname(target) or "."
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None   # a new file (or a symlink to one)
    except OSError as e:   # a symlink loop, a name too long, a file where a directory should be
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise HeapsightError(f"{option} {path}: {parent} is not a directory; give a path "
                                 "in a directory") from None
        raise HeapsightError(f"{option} {path}: {e.strerror}; give another path") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise HeapsightError(f"{option} {path} is a directory: give a file name inside it, "
                             f"e.g. {os.path.join(path, 'out')}")
    if mode is not None and stat.S_ISSOCK(mode):
        raise HeapsightError(f"{option} {path} is a socket, which heapsight cannot write; give "
                             "a file, a FIFO or a device")
    if mode is not None and not stat.S_ISREG(mode):   # a device or a FIFO: written in place
        if not os.access(target, os.W_OK):
            raise HeapsightError(f"{option} {path}: not writable (permission denied)")
        return
    if not os.path.isdir(parent):
        raise HeapsightError(f"{option} {path}: directory {parent} does not exist (create it, "
                             "or give another path)")
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except OSError:
        name_max = 255
    if len(os.fsencode(os.path.basename(target))) > name_max:
        raise HeapsightError(f"{option} {path}: the file name is longer than {name_max} bytes; "
                             "give a shorter one")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(target) and
                                                    not os.access(target, os.W_OK)):
        raise HeapsightError(f"{option} {path}: not writable (permission denied); give a path "
                             "in a directory you can write")
    try:   # a read-only file system, which access() does not see
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=parent)
    except OSError as e:
        raise HeapsightError(f"{option} {path}: cannot write in {parent} ({e.strerror})") from e
    os.close(fd)
    os.unlink(probe)


def write(path: str, data: bytes | str, *, gzip: bool | None = None) -> None:
    """Writes data to path ('-': stdout) whole or not at all; gzip by the .gz suffix when
    gzip is None. A new or replaced regular file is 0600 and the writer's; a device or a
    FIFO is written in place, its mode and owner untouched. Text is UTF-8 with undecodable
    bytes (surrogate escapes) written back as those bytes, and any other lone surrogate as
    \\uNNNN. Raises HeapsightError (exit 1) when it cannot."""
    if isinstance(data, str):
        data = OTHER_SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", data)
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
    target = os.path.realpath(path)
    if _special(target):   # interrupts are not deferred here: see _open_special
        try:
            with _open_special(target, path) as f:
                f.write(data)
        except OSError as e:
            raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
        return
    parent = os.path.dirname(target) or "."
    with interrupts.deferred():
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=parent)
            with os.fdopen(fd, "wb") as f:   # mkstemp makes it 0600
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            tmp = None
            _sync_dir(parent)
        except OSError as e:
            raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def _open_special(target: str, path: str):
    """A device, or a FIFO once it has a reader. A FIFO nobody reads must not hold
    heapsight past Ctrl-C, even where the caller defers interrupts (commands that save
    a finished run do): the wait gives up when one is pending, and it acts when the caller
    lets it."""
    if not stat.S_ISFIFO(os.stat(target).st_mode):
        return open(target, "wb")
    while True:
        try:
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)   # ENXIO: no reader yet
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            if interrupts.WATCHED & signal.sigpending():
                raise HeapsightError(f"cannot write {path}: interrupted while waiting for the "
                                     "FIFO's reader", 1) from None
            time.sleep(FIFO_POLL_S)
            continue
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb")


def _sync_dir(parent: str) -> None:
    """The rename itself on disk (best effort: some file systems refuse)."""
    try:
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _finite(v):
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def dumps(doc, indent: int | None = None) -> str:
    """Strict JSON (what record.load reads back): a NaN or an infinity, which JSON has no
    word for, is written as null (not measured); strings that hold undecodable bytes
    (surrogate escapes) as \\udcXX escapes, which load back as the same strings."""
    seps = (",", ":") if indent is None else None
    try:
        return json.dumps(doc, indent=indent, separators=seps, allow_nan=False)
    except ValueError:   # rare: walk the document only then
        return json.dumps(_finite(doc), indent=indent, separators=seps, allow_nan=False)


def write_json(path: str, doc: dict, indent: int | None = 2) -> None:
    """JSON to path ('-': stdout), as dumps() makes it."""
    write(path, dumps(doc, indent) + "\n", gzip=False if path == "-" else None)


def save_doc(path: str, doc: dict) -> None:
    """A saved document (run record, comparison, lab results): compact JSON (dumps), gzip'd
    when the name ends in .gz."""
    write(path, dumps(doc))
