"""Names for the sampled stacks' addresses, after the run: function, file:line where the
object has debug info (its own, or a separate file under /usr/lib/debug found by build-id),
the object alone otherwise.

One llvm-symbolizer process (Debian package llvm) answers for every object: lines
"OBJECT 0xADDRESS" in, one JSON line out per address. Chosen over binutils' addr2line for
correctness: on a stripped binary addr2line names the exported symbol before an address
that no symbol covers (an address 40 bytes past PyAIter_Check's end in /usr/bin/python3.11
comes back as PyAIter_Check), where llvm-symbolizer says it does not know; such frames are
then shown as object+0xoffset, never under a wrong name. Speed is about the same, measured
here (2 cores; median of three; the addresses of real runs sampled at a 1 KiB mean;
addr2line -f -i in batch mode, one process per object):

    program                                  addresses  objects  llvm-symbolizer  addr2line
    python3 -m pydoc -k (imports everything)     1,954       34       0.14 s         0.19 s
    python3 -m compileall (email, json, xml)     1,540        6       0.13 s         0.18 s
    python3: sqlite3, json, minidom, difflib       837       11       0.10 s         0.09 s
    perl building a hash                           170        4       0.08 s         0.06 s
    random addresses in exported functions       3,635        3       0.13 s         0.13 s
      of python3.11, libperl and libc (libc6-dbg: file:line)

(pydoc's 9,290 distinct stacks hold about 520,000 frames; each distinct address is looked
up once, and sites.build took 0.33 s in all for three moments.)

Inlined code: llvm-symbolizer --inlines gives the chain of functions inlined at an
address; each becomes a frame of its own (innermost first, the function the code is in
last), so a wrapper inlined into its caller (xmalloc, std::allocator::allocate) is
stepped over like a called one, and the caller shows at its own line.

Symbolizing never fails a run: without the tool, or when it fails, every frame is named
object+0xoffset and the result's note says why in one line."""

from __future__ import annotations

import collections
import glob
import json
import os
import shutil
import subprocess

from heapsight.dataclass import dataclass
from heapsight.fmt import printable

TIMEOUT_S = 60
TOOL = "llvm-symbolizer"


@dataclass(frozen=True)
class Frame:
    function: str | None     # None: not known
    file: str | None
    line: int | None
    object: str              # the object's path
    address: int             # the address looked up, in the object's file (call site)

    def as_dict(self) -> dict:
        """The fields by name (dataclasses.asdict's answer, without its deep copies: it took
        13.6 ms of saving node's 1,243 frames, 0.5 ms so)."""
        return {"function": self.function, "file": self.file, "line": self.line,
                "object": self.object, "address": self.address}

    def name(self) -> str:
        """How a person reads it: 'parse_row (x.c:12)', 'PyList_Append (python3.11)' or
        'python3.11+0x1234'."""
        # the names come from the program's files and paths: a control character there (an
        # escape sequence in a file name) is shown, never obeyed by a terminal
        obj = printable(os.path.basename(self.object) or self.object)
        if self.function is None:
            return f"{obj}+{self.address:#x}"
        if self.file and self.line:
            return f"{printable(self.function)} ({printable(os.path.basename(self.file))}:{self.line})"
        return f"{printable(self.function)} ({obj})"


def find_tool() -> str | None:
    """llvm-symbolizer: HEAPSIGHT_SYMBOLIZER when set (a path; empty: none), else on PATH,
    else Debian's versioned name."""
    if "HEAPSIGHT_SYMBOLIZER" in os.environ:
        path = os.environ["HEAPSIGHT_SYMBOLIZER"]
        return path if path and os.access(path, os.X_OK) else None
    found = shutil.which(TOOL)
    if found:
        return found
    versioned = sorted(glob.glob(f"/usr/bin/{TOOL}-[0-9]*"),
                       key=lambda p: int(p.rsplit("-", 1)[1]) if p.rsplit("-", 1)[1].isdigit() else 0)
    return versioned[-1] if versioned else None


def unknown(obj: str, address: int) -> list:
    return [Frame(None, None, None, obj, address)]


def _quoted(path: str) -> str | None:
    """The object as llvm-symbolizer reads it on a line (quoted when it holds spaces);
    None when no line can carry it."""
    if '"' in path or "\n" in path or "\r" in path:
        return None
    return f'"{path}"' if " " in path or "\t" in path else path


def _frames(answer: dict, obj: str, address: int) -> list:
    out = []
    for sym in answer.get("Symbol") or ():
        fn = sym.get("FunctionName") or None
        if fn == "??":
            fn = None
        file = sym.get("FileName") or None
        line = sym.get("Line") or None
        if fn is None and not out:
            continue
        out.append(Frame(fn, file if file != "??" else None, line if fn else None, obj, address))
    return out or unknown(obj, address)


class Result:
    """What symbolize() found: frames[(object, address)] innermost first, and how."""
    def __init__(self, frames: dict, tool: str, note: str = ""):
        self.frames, self.tool, self.note = frames, tool, note


def symbolize(lookups, tool: str | None = None) -> Result:
    """lookups: (object path, address in the file) pairs; every one gets its frames. What the
    run's session already answered (prefetch(), while the program ran) is not asked again."""
    lookups = list(dict.fromkeys(lookups))
    frames = {key: unknown(*key) for key in lookups}
    tool = tool or find_tool()
    if not lookups:
        return Result(frames, TOOL if tool else "none")
    if tool is None:
        return Result(frames, "none", f"{TOOL} not found (Debian: apt install llvm): functions "
                      "are shown as object+offset")
    asked = _askable(lookups)
    kept = _kept(tool, asked)   # answered by this tool on an earlier run
    for key, line in kept.items():
        frames[key] = _frames(json.loads(line), *key)
    asked = [key for key in asked if key not in kept]
    if not asked:
        return Result(frames, TOOL)
    import time
    t0 = time.perf_counter()
    answers, why = _session(tool, asked).ask(asked)
    from heapsight import phases
    phases.waited("the symbolizer", time.perf_counter() - t0)
    if answers is None:
        return Result(frames, "none", f"{TOOL} failed ({why}): functions are shown as "
                      "object+offset")
    for key in asked:
        try:
            frames[key] = _frames(json.loads(answers[key]), *key)
        except (KeyError, ValueError, AttributeError, TypeError):
            pass
    _keep(tool, answers)
    return Result(frames, TOOL)


def prefetch(lookups, tool: str | None = None) -> None:
    """Sends lookups to the run's session without waiting for the answers: while the program
    runs, the symbolizer reads the objects and answers on the other core, and symbolize()
    at the end finds them answered (python3's 375 addresses: 0.3 s of a 0.7 s run, before)."""
    tool = tool or find_tool()
    asked = _askable(list(dict.fromkeys(lookups))) if tool else []
    kept = _kept(tool, asked) if asked else {}
    asked = [key for key in asked if key not in kept]
    if asked:
        _session(tool, asked).send(asked)


def warm_up(lookups, tool: str | None = None) -> None:
    """Has the tool read these objects (their debug information: libc's takes it 90 ms)
    while the program runs, so that the names asked at the end are answered at once; not
    an object an earlier run kept answers for (the addresses asked at the end are most
    likely among them, and the rest are asked then)."""
    tool = tool or find_tool()
    if tool:
        files = {obj: _cache_file(tool, obj) for obj, _ in lookups}
        prefetch([(obj, address) for obj, address in lookups
                  if files[obj] is None or not _read_kept(files[obj])], tool)


def _askable(lookups: list) -> list:
    """The lookups a line can carry, of objects that exist (each object looked at once)."""
    ok: dict = {}
    for obj, _ in lookups:
        if obj not in ok:
            ok[obj] = _quoted(obj) is not None and os.path.exists(obj)
    return [(obj, address) for obj, address in lookups if ok[obj]]


def _stamp(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


# Answers kept between runs (the names cache): the tool's answer for an address of an object
# is the same as long as the object, the files the tool would read its debug information
# from and the tool are the files they were, so the answers are kept under $XDG_CACHE_HOME/
# heapsight/names (~/.cache/heapsight/names), one file per object as it was (its path, inode,
# size and mtime; each place its separate debug information may be, as it was or absent:
# _debug_sources) and tool, and the next run reads them instead of starting the tool: libc's
# debug information alone is 90 ms of the tool's CPU (libc6-dbg), on the core the end's
# imports need, and a stripped interpreter's symbols (python3, perl: no -dbg package) were
# read again by a tool started for them at every run. Debug information installed since
# (a -dbg package, a file beside the object) changes the key: its answers are asked again.
# An object whose debug sources cannot be told (not a 64-bit ELF file) keeps complete
# answers only (every frame with its function, file and line). HEAPSIGHT_NAMES_CACHE=0 turns
# it off. Never more than CACHE_FILES files (the oldest go) of CACHE_ANSWERS answers each
# (the oldest go): a file is read at every run, and rewritten at each that adds to it
# (20,000 answers as the tool writes them: 5.5 MB, 40 ms to read; kept compact, 10,000
# are 1.1 MB).
CACHE_FILES, CACHE_ANSWERS = 256, 10_000
_KEPT: dict = {}   # cache file -> {address: the tool's JSON line}, as read or written


def _cache_file(tool: str, obj: str) -> str | None:
    if os.environ.get("HEAPSIGHT_NAMES_CACHE", "1") == "0":
        return None
    st, tool_st = _stamp(obj), _stamp(tool)
    if st is None or tool_st is None:
        return None
    import hashlib
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = hashlib.sha256(repr((obj, st, tool, tool_st, _debug_sources(obj)))
                         .encode(errors="surrogateescape"))
    return os.path.join(base, "heapsight", "names", key.hexdigest()[:32] + ".json")


DEBUG_DIR = "/usr/lib/debug"
_SOURCES: dict = {}   # object -> _debug_sources' answer, for this process


def _debug_sources(obj: str) -> tuple | None:
    """Where the tool would read obj's separate debug information from, each place with its
    stamp (None: nothing there): the file its build ID names under DEBUG_DIR, and the file
    its .gnu_debuglink names beside it, in .debug/ beside it and under DEBUG_DIR (the
    places llvm-symbolizer looks, without debuginfod, which the session turns off). () for
    an ELF file that names none; None when obj cannot be read as a 64-bit ELF file."""
    if obj not in _SOURCES:
        _SOURCES[obj] = _read_debug_sources(obj)
    return _SOURCES[obj]


def _read_debug_sources(obj: str) -> tuple | None:
    import stat
    import struct
    try:   # a regular file only: a FIFO put in a library's place since must not block
        fd = os.open(obj, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            shoff, = struct.unpack_from("<Q", head, 0x28)
            entsize, count, names_at = struct.unpack_from("<HHH", head, 0x3A)
            if not shoff or entsize != 64 or not 0 < count <= 4096 or names_at >= count:
                return None
            f.seek(shoff)
            table = f.read(count * 64)
            if len(table) < count * 64:
                return None
            sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * 64) for i in range(count)]

            def contents(sec, most=1 << 16) -> bytes:
                f.seek(sec[4])
                return f.read(min(sec[5], most))
            names = contents(sections[names_at], 1 << 20)
            build_id = link = None
            for sec in sections:
                name = names[sec[0]:names.find(b"\0", sec[0])]
                if name == b".note.gnu.build-id":
                    note = contents(sec)
                    if len(note) >= 16:
                        namesz, descsz, kind = struct.unpack_from("<III", note)
                        at = 12 + ((namesz + 3) & ~3)
                        if kind == 3 and note[12:12 + namesz].rstrip(b"\0") == b"GNU":
                            build_id = note[at:at + descsz].hex()
                elif name == b".gnu_debuglink":
                    link = os.fsdecode(contents(sec).split(b"\0", 1)[0]) or None
    except (OSError, struct.error, ValueError):
        return None
    places = []
    if build_id and len(build_id) > 2:
        places.append(os.path.join(DEBUG_DIR, ".build-id", build_id[:2], build_id[2:] + ".debug"))
    if link and "/" not in link:
        folder = os.path.dirname(obj)
        places += [os.path.join(folder, link), os.path.join(folder, ".debug", link),
                   DEBUG_DIR + os.path.join(folder, link)]
    return tuple((p, _stamp(p)) for p in places)


def _ours(folder: str) -> bool:
    """Whether the cache's folder, and heapsight's folder above it, are directories of this
    user's that no one else can write (an XDG_CACHE_HOME shared with others is not used:
    names planted there would be shown, and files kept there removed)."""
    import stat
    for d in (folder, os.path.dirname(folder)):
        try:
            st = os.lstat(d)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return False
    return True


def _read_kept(path: str) -> dict:
    if path not in _KEPT:
        _KEPT[path] = {}
        if _ours(os.path.dirname(path)):
            import stat
            try:   # a regular file only: never a link, nor a FIFO that would block the run
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                with os.fdopen(fd, encoding="utf-8") as f:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        _KEPT[path] = {int(a): line for a, line in json.load(f)["answers"].items()
                                       if isinstance(line, str)}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass
    return _KEPT[path]


def _kept(tool: str | None, keys: list) -> dict:
    """{key: the tool's JSON line} for the keys an earlier run kept the answer of."""
    out, files = {}, {}
    for obj, address in keys if tool else ():
        if obj not in files:
            files[obj] = _cache_file(tool, obj)
        if files[obj] is not None:
            line = _read_kept(files[obj]).get(address)
            if line is not None:
                out[(obj, address)] = line
    return out


def _answered(line: str) -> bool:
    """Whether the tool's line is an answer (its frames, "??" where it knows none), not an
    error (an object it could not read)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("Symbol"), list) and "Error" not in doc


def _complete(line: str) -> bool:
    try:
        symbols = json.loads(line).get("Symbol") or ()
    except (ValueError, AttributeError):
        return False
    return bool(symbols) and all(
        isinstance(x, dict) and x.get("FunctionName") not in (None, "", "??")
        and x.get("FileName") not in (None, "", "??") and (x.get("Line") or 0) > 0
        for x in symbols)


def _compact(line: str) -> str:
    """The tool's answer as kept: its frames' function, file and line (_frames reads no
    more), a third of the line it wrote."""
    symbols = json.loads(line)["Symbol"]
    return json.dumps({"Symbol": [{k: x.get(k) for k in ("FunctionName", "FileName", "Line")}
                                  for x in symbols if isinstance(x, dict)]},
                      separators=(",", ":"))


def _keep(tool: str, answers: dict) -> None:
    """Writes answers ({(object, address): line}) to the cache: all of an object whose debug
    sources are known (_debug_sources), the complete ones of another; a cache that cannot
    be written is left alone (the names are the same without it)."""
    by_obj: dict = {}
    for (obj, address), line in answers.items():
        if _complete(line) or (_debug_sources(obj) is not None and _answered(line)):
            by_obj.setdefault(obj, {})[address] = _compact(line)
    for obj, new in by_obj.items():
        path = _cache_file(tool, obj)
        if path is None:
            continue
        kept = _read_kept(path)
        if all(kept.get(a) == line for a, line in new.items()):
            continue
        kept.update(new)
        while len(kept) > CACHE_ANSWERS:
            kept.pop(next(iter(kept)))
        _write_kept(path, obj, kept)


def _write_kept(path: str, obj: str, kept: dict) -> None:
    import tempfile
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if not _ours(folder):
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".names-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                json.dump({"object": obj, "answers": {str(a): line for a, line in kept.items()}}, f)
            os.replace(tmp, path)   # whole or not at all: another run may read it meanwhile
        except BaseException:
            os.unlink(tmp)
            raise
        files = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")]
        if len(files) > CACHE_FILES:
            files.sort(key=lambda f: os.stat(f).st_mtime_ns)
            for old in files[:len(files) - CACHE_FILES]:
                os.unlink(old)
    except OSError:
        pass


class _Session:
    """One llvm-symbolizer kept running for the run's lookups (the sites at the peak, the
    mappings', the heap maps' pinners; those sent while the program ran): it reads each
    object's symbols once; a process per lookup read python3's twice, 0.3 s of a 1.8 s run.
    A line in, one JSON line out, flushed per line. Each answer is kept by its (object,
    address): an address sent twice is asked once. A reader thread takes the answers as
    they come, so that a writer never waits on a full pipe and send() never waits at all.
    An object rebuilt at the same path since it was read ends the session (the tool would
    answer from the old file)."""

    def __init__(self, tool: str):
        import threading
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEBUGINFOD")}  # no network
        import tempfile
        self.err = tempfile.TemporaryFile()   # its warnings, unbounded: a pipe could fill
        self.p = subprocess.Popen([tool, "--output-style=JSON", "--inlines", "--demangle"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, env=env)
        try:   # below the program it shares the machine with
            os.setpriority(os.PRIO_PROCESS, self.p.pid, 10)
        except OSError:
            pass
        self.tool = tool
        self.cond = threading.Condition()
        self.answers: dict = {}    # (object, address) -> its JSON line
        self.pending = collections.deque()   # the keys sent, in order, not yet answered
        self.wlock = threading.Lock()
        self.sent: set = set()
        self.stamps: dict = {}     # object -> _stamp when first sent
        self.ended = ""            # why the tool stopped answering, once it has
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        buf, fd = b"", self.p.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                chunk = b""
            with self.cond:
                if not chunk:
                    self.p.wait()
                    self.err.seek(0)
                    err = self.err.read(4096).decode(errors="replace").strip().splitlines()
                    self.ended = f"exit {self.p.returncode}" + (f": {err[0][:100]}" if err else "")
                    self.cond.notify_all()
                    return
                buf += chunk
                *done, buf = buf.split(b"\n")
                for line in done:
                    if self.pending:
                        self.answers[self.pending.popleft()] = line.decode(errors="replace")
                self.cond.notify_all()

    def fresh(self, keys: list) -> bool:
        """Whether every object of keys is the file the tool read (or has not read yet)."""
        objs = {obj for obj, _ in keys}
        return all(obj not in self.stamps or self.stamps[obj] == _stamp(obj) for obj in objs)

    def send(self, keys: list) -> None:
        """Asks for the keys not asked before; returns once they are written (the reader
        thread drains the answers meanwhile, so a full pipe only waits for the tool)."""
        with self.wlock:   # lines are written in the order pending has them
            with self.cond:
                new = [k for k in keys if k not in self.sent]
                if not new or self.ended:
                    return
                for obj, _ in new:
                    if obj not in self.stamps:
                        self.stamps[obj] = _stamp(obj)
                self.sent.update(new)
                self.pending.extend(new)
            text = "".join(f"{_quoted(obj)} {address:#x}\n" for obj, address in new).encode()
            try:
                self.p.stdin.write(text)
                self.p.stdin.flush()
            except (OSError, ValueError):
                pass

    def ask(self, keys: list) -> tuple:
        """({key: answer}, "") or (None, why) for keys, within TIMEOUT_S."""
        import time
        deadline = time.monotonic() + TIMEOUT_S
        # a writer thread: a pipe full of questions must not wait on our reading
        import threading
        writer = threading.Thread(target=self.send, args=(keys,), daemon=True)
        writer.start()
        with self.cond:
            while not all(k in self.answers for k in keys):
                left = deadline - time.monotonic()
                if self.ended:
                    return None, self.ended
                if left <= 0:
                    break
                self.cond.wait(left)
            else:
                writer.join()
                return {k: self.answers[k] for k in keys}, ""
        self.close()
        return None, f"ran past {TIMEOUT_S} s"

    def close(self) -> None:
        """Ends the tool and its reader (which owns stdout until then: an fd closed under
        a thread reading it could be another file's by its next read)."""
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.reader.join(timeout=5)
        if not self.reader.is_alive():
            self.p.stdout.close()


_SESSIONS: dict = {}


def _session(tool: str, keys: list = ()) -> "_Session | _Failed":
    """The running session for tool, started on first use (again when an object of keys
    was rebuilt since it read it), ended at exit."""
    s = _SESSIONS.get(tool)
    if s is not None and (s.ended or s.p.poll() is not None or s.p.stdin.closed
                          or not s.fresh(list(keys))):
        s.close()
        s = None
    if s is None:
        try:
            s = _SESSIONS[tool] = _Session(tool)
        except OSError as e:
            return _Failed(e.strerror or str(e))
        if len(_SESSIONS) == 1:
            import atexit
            atexit.register(_close_all)
    return s


class _Failed:
    def __init__(self, why: str):
        self.why = why

    def ask(self, keys):
        return None, self.why

    def send(self, keys):
        pass


def _close_all() -> None:
    for s in list(_SESSIONS.values()):
        s.close()
    _SESSIONS.clear()
