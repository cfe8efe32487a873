"""Every file heapsight writes goes through here: checked before any long work, written
whole or not at all, never truncating, replacing or chmod'ing what heapsight did not make.

- A regular file (or a new path) is written to a unique temporary file in the same
  directory, flushed to disk and renamed over the target: a reader never sees half a file,
  and two heapsight processes writing the same path never share a temporary name. A file
  that existed when the path was checked is replaced, keeping its mode; a new file is
  0600 (a record holds the whole command line, which may carry secrets). A file that
  another process made at that path meanwhile (a second run with the same -o) is never
  replaced: the output goes beside it (NAME-1.EXT) and heapsight says so.
- One of heapsight's own descriptors named as a path (/dev/stdout, /dev/stderr, /dev/fd/N,
  /proc/self/fd/N) is written through that descriptor, after what is there already: the
  program's output, when it is the program's stdout too. A regular file that is
  heapsight's stdout or stderr under another name is refused (replacing it would lose
  what the program wrote there).
- A FIFO (or a pipe) is opened when checked, before the program runs, and written at the
  end: one with no reader is refused at once, never waited for. A device (/dev/null) is
  written in place. A symlink the user named is followed (its target is written, the link
  stays) only as it was when the path was checked, and only when it is the user's own or
  root's: a link another user plants at the path, or swaps in, is never followed (in a
  shared directory such as /tmp, another user could otherwise point root's record at any
  file); the output then goes beside it.
- Ctrl-C, SIGTERM and SIGHUP wait while a file is written (then take effect): an
  interrupt never loses a finished run and never leaves a temporary file behind.
- A socket is refused: heapsight cannot open one as a file.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import sys

from heapsight import interrupts
from heapsight.errors import HeapsightError


# Lone surrogates that are not surrogate-escaped bytes (those are U+DC80..U+DCFF).
OTHER_SURROGATES = re.compile("[\ud800-\udc7f\udd00-\udfff]")
TEMP_STEM_CHARS = 40   # of the target's name in its temporary file's: any valid name fits
STD_NAMES = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
FD_LINK = re.compile(r"/(?:dev/fd|proc/self/fd|proc/(\d+)/fd)/(\d+)")
STREAM_NAMES = {0: "stdin", 1: "stdout", 2: "stderr"}
ASIDE_MAX = 1000       # NAME-1.EXT ... when a file appeared at NAME meanwhile

_UNCHECKED = object()
_checked = {}   # real path -> (st_dev, st_ino) of the regular file there when checked, or None
_held = {}      # absolute path -> fd of a FIFO opened when checked, written at the end


def default_name(stem: str, ext: str = ".hsrun.json.gz") -> str:
    """A default output name in the current directory: STEM.EXT, or, where other users can
    write (a world-writable directory such as /tmp), STEM.XXXXXXXX.EXT with a random part,
    so that no one can put a file or a link there before heapsight writes it."""
    try:
        shared = bool(os.stat(".").st_mode & stat.S_IWOTH)
    except OSError:
        shared = False
    return f"{stem}.{os.urandom(4).hex()}{ext}" if shared else f"{stem}{ext}"


def write_target(path: str) -> str:
    """Where a write to path goes: path itself in its directory's real path, or, when path
    is a symlink of the user's own (or root's), the file it points to. A link of another
    user's is not followed: the write then finds a link there and goes beside it."""
    parent = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    here = os.path.join(parent, os.path.basename(path))
    try:
        st = os.lstat(here)
    except OSError:
        return here
    if stat.S_ISLNK(st.st_mode) and st.st_uid in (os.geteuid(), 0):
        return os.path.realpath(here)
    return here


def _temp_prefix(target: str) -> str:
    return f".{os.path.basename(target)[:TEMP_STEM_CHARS]}."


def own_fd(path: str) -> int | None:
    """The descriptor of heapsight's own that path names, if it names one."""
    p = os.path.normpath(os.path.abspath(path))
    if p in STD_NAMES:
        return STD_NAMES[p]
    m = FD_LINK.fullmatch(p)
    if m and (m.group(1) is None or int(m.group(1)) == os.getpid()):
        return int(m.group(2))
    return None


def _fd_writable(fd: int) -> bool:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR)
    except OSError:
        return False


def _std_stream_of(st) -> str | None:
    """'stdout' or 'stderr' when st is the same file as heapsight's (the program's too)."""
    for fd in (1, 2):
        try:
            own = os.fstat(fd)
        except OSError:
            continue
        if (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino):
            return STREAM_NAMES[fd]
    return None


def check_all(outputs, inputs=()) -> None:
    """Every output of one command, before any work: each one writable (check()), no two
    of them the same file, and none of them a file the command reads. outputs: (option,
    path, allow_stdout) with path None for an output not asked for; inputs: paths."""
    asked = [(o, p, std) for o, p, std in outputs if p]
    seen = {os.path.realpath(p): "the input" for p in inputs}
    for option, path, _ in asked:
        if path == "-":
            continue
        real = os.path.realpath(path)
        shared_device = os.path.exists(real) and not os.path.isfile(real)   # /dev/null twice is fine
        if real in seen and not shared_device:
            if seen[real] == "the input":
                raise HeapsightError(f"{option} {path} is one of the files to read: give the "
                                     "output another name")
            raise HeapsightError(f"{option} {path} is also given to {seen[real]}: one would "
                                 "overwrite the other; give each output its own file")
        seen.setdefault(real, option)
    for option, path, allow_stdout in asked:
        check(path, option, allow_stdout=allow_stdout)


def check(path: str, option: str, allow_stdout: bool = False) -> None:
    """Refuses an output path that cannot be written, before any work is done: one line
    naming the option, the path, the problem and the fix (exit code 2). A FIFO is opened
    here (it must have a reader now), and a regular file's identity noted, so that write()
    never replaces a file another process made meanwhile."""
    if path == "-":
        if allow_stdout:
            return
        raise HeapsightError(f"{option} -: this output cannot go to stdout; give a file name")
    if not path:
        raise HeapsightError(f"{option}: the file name is empty")
    fd = own_fd(path)
    if fd is not None:
        if not _fd_writable(fd):
            raise HeapsightError(f"{option} {path}: heapsight's {STREAM_NAMES.get(fd, f'fd {fd}')} "
                                 "is not open for writing; give a file name")
        return
    target = write_target(path)
    parent = os.path.dirname(target) or "."
    try:
        st = os.stat(target)
        if os.path.islink(target):   # another user's link, not followed: written beside
            st = None
    except FileNotFoundError:
        st = None   # a new file (or a symlink to one)
    except OSError as e:   # a symlink loop, a name too long, a file where a directory should be
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise HeapsightError(f"{option} {path}: {parent} is not a directory; give a path "
                                 "in a directory") from None
        raise HeapsightError(f"{option} {path}: {e.strerror}; give another path") from None
    mode = st.st_mode if st is not None else None
    if mode is not None and stat.S_ISDIR(mode):
        raise HeapsightError(f"{option} {path} is a directory: give a file name inside it, "
                             f"e.g. {os.path.join(path, 'out')}")
    if mode is not None and stat.S_ISSOCK(mode):
        raise HeapsightError(f"{option} {path} is a socket, which heapsight cannot write; give "
                             "a file, a FIFO or a device")
    if mode is not None and stat.S_ISFIFO(mode):
        _hold_fifo(path, option)
        return
    if mode is not None and not stat.S_ISREG(mode):   # a device: written in place
        if not os.access(path, os.W_OK):
            raise HeapsightError(f"{option} {path}: not writable (permission denied)")
        return
    stream = _std_stream_of(st) if st is not None else None
    if stream:
        raise HeapsightError(f"{option} {path} is heapsight's {stream} too, where the program "
                             "writes: replacing it would lose that output; give another file, "
                             f"or /dev/{stream} to add it after the output")
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
    if not os.access(parent, os.W_OK | os.X_OK) or (st is not None and
                                                    not os.access(target, os.W_OK)):
        raise HeapsightError(f"{option} {path}: not writable (permission denied); give a path "
                             "in a directory you can write")
    try:   # a read-only file system, which access() does not see
        import tempfile   # here: it costs every start 2 ms
        fd, probe = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=parent)
    except OSError as e:
        raise HeapsightError(f"{option} {path}: cannot write in {parent} ({e.strerror})") from e
    os.close(fd)
    os.unlink(probe)
    _checked[target] = (st.st_dev, st.st_ino) if st is not None else None


def _hold_fifo(path: str, option: str) -> None:
    """Opens a FIFO for the write at the end; refuses one with no reader now. (Opening and
    closing it here would give its reader an end of file.)"""
    key = os.path.abspath(path)
    if key in _held:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise HeapsightError(f"{option} {path} is a FIFO with no reader: start its reader "
                                 f"first (e.g. cat {path} > copy &), or give a file name") from None
        raise HeapsightError(f"{option} {path}: cannot open it ({e.strerror})") from None
    os.set_blocking(fd, True)
    _held[key] = fd


def write(path: str, data: bytes | str, *, gzip: bool | None = None) -> str:
    """Writes data to path ('-': stdout) whole or not at all; gzip by the .gz suffix when
    gzip is None. Returns the path written, which is another name beside path when another
    process made a file at path since it was checked (heapsight says so on stderr). Text
    is UTF-8 with undecodable bytes (surrogate escapes) written back as those bytes, and
    any other lone surrogate as \\uNNNN. Raises HeapsightError (exit 1) when it cannot."""
    if isinstance(data, str):
        try:   # the common case, with no surrogate at all: one pass in C (a record: 0.5 ms)
            data = data.encode("utf-8")
        except UnicodeEncodeError:
            data = OTHER_SURROGATES.sub(lambda m: f"\\u{ord(m.group()):04x}", data)
            data = data.encode("utf-8", "surrogateescape")
    if gzip is None:
        gzip = path.endswith(".gz")
    if gzip:
        import gzip as gzip_module
        # level 3: a record 9% larger than at 6, in half the time (perl's hash: 8.6 ms
        # against 18.9 for 540 KB of JSON)
        data = gzip_module.compress(data, compresslevel=3, mtime=0)
    if path == "-":
        sys.stdout.flush()
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except OSError as e:
            raise HeapsightError(f"cannot write -: {e.strerror}", 1) from e
        return path
    fd = own_fd(path)
    held = None if fd is not None else _held.pop(os.path.abspath(path), None)
    if fd is None and held is None:
        # what the path names now, a link followed only as write_target follows one: a
        # link another user planted (to a device, a FIFO) is never written through
        target = write_target(path)
        try:
            mode = os.lstat(target).st_mode
        except OSError:
            mode = None
        if mode is not None and stat.S_ISFIFO(mode):
            held = _open_fifo(target)
        elif mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or
                                       stat.S_ISLNK(mode)):
            try:   # a device, written in place
                with open(os.open(target, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "wb") as f:
                    f.write(data)
            except OSError as e:
                raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
            return path
    if fd is not None or held is not None:
        try:
            _write_all(fd if fd is not None else held, data)
        except OSError as e:
            raise HeapsightError(f"cannot write {path}: {e.strerror}", 1) from e
        finally:
            if held is not None:
                os.close(held)
        return path
    return _write_file(path, data)


def _open_fifo(path: str) -> int:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as e:
        why = "the FIFO has no reader" if e.errno == errno.ENXIO else e.strerror
        raise HeapsightError(f"cannot write {path}: {why}", 1) from None
    os.set_blocking(fd, True)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    """Through a descriptor, after what is there: heapsight's own buffered text first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and stream.fileno() == fd:
                stream.flush()
        except (OSError, ValueError):
            pass
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_file(path: str, data: bytes) -> str:
    # the target check() resolved, never a link that appeared since (write_target)
    target = write_target(path)
    parent = os.path.dirname(target) or "."
    final = target
    with interrupts.deferred():
        tmp = None
        try:
            import tempfile
            fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(target), suffix=".tmp", dir=parent)
            try:   # the entry itself: a link is never written through here
                now = os.lstat(target)
            except FileNotFoundError:
                now = None
            ident = (now.st_dev, now.st_ino) if now is not None else None
            before = _checked.get(target, _UNCHECKED)
            # replaced: the regular file that was there when checked, or, unchecked, one of
            # the user's own; anything else (a link, another user's file) is left, and the
            # output goes beside it
            regular = now is not None and stat.S_ISREG(now.st_mode)
            replace = regular and (before == ident or
                                   (before is _UNCHECKED and now.st_uid == os.geteuid()))
            with os.fdopen(fd, "wb") as f:   # mkstemp makes it 0600
                if replace:   # the file the user named keeps its mode
                    os.fchmod(f.fileno(), stat.S_IMODE(now.st_mode) & 0o777)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, target)
            else:
                final = _link_new(tmp, target)
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
        if target in _checked:   # written by us now: a second write replaces it
            st = os.stat(final)
            _checked[final] = (st.st_dev, st.st_ino)
    if final == target:
        return path
    if not os.path.islink(path):   # named as the user named the directory
        final = os.path.join(os.path.dirname(path), os.path.basename(final))
    sys.stderr.write(f"heapsight: {path} was made by another process while heapsight worked "
                     f"(a second run with the same output, or a link another user put there?): "
                     f"not replaced, not followed; written to {final}\n")
    return final


def _link_new(tmp: str, target: str) -> str:
    """Gives tmp the name target, or NAME-N.EXT beside it, without replacing any file."""
    d, name = os.path.split(target)
    dot = name.find(".", 1)
    base, ext = (name[:dot], name[dot:]) if dot > 0 else (name, "")
    for n in range(ASIDE_MAX):
        cand = target if n == 0 else os.path.join(d, f"{base}-{n}{ext}")
        try:
            os.link(tmp, cand)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            if os.path.lexists(cand):   # a file system without hard links
                continue
            os.replace(tmp, cand)
            return cand
        os.unlink(tmp)
        return cand
    raise OSError(errno.EEXIST, f"{base}-1{ext} to {base}-{ASIDE_MAX - 1}{ext} exist too")


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
    import json   # (not before the program starts)
    seps = (",", ":") if indent is None else None
    try:
        return json.dumps(doc, indent=indent, separators=seps, allow_nan=False)
    except ValueError:   # rare: walk the document only then
        return json.dumps(_finite(doc), indent=indent, separators=seps, allow_nan=False)


def write_json(path: str, doc: dict, indent: int | None = 2) -> str:
    """JSON to path ('-': stdout), as dumps() makes it; the path written (see write)."""
    return write(path, dumps(doc, indent) + "\n", gzip=False if path == "-" else None)


def save_doc(path: str, doc: dict) -> str:
    """A saved document (run record, comparison, lab results): compact JSON (dumps), gzip'd
    when the name ends in .gz; the path written (see write)."""
    return write(path, dumps(doc))
