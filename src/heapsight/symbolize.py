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

import glob
import json
import os
import shutil
import subprocess
from dataclasses import dataclass

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
    """lookups: (object path, address in the file) pairs; every one gets its frames."""
    lookups = list(dict.fromkeys(lookups))
    frames = {key: unknown(*key) for key in lookups}
    tool = tool or find_tool()
    if not lookups:
        return Result(frames, TOOL if tool else "none")
    if tool is None:
        return Result(frames, "none", f"{TOOL} not found (Debian: apt install llvm): functions "
                      "are shown as object+offset")
    asked = []
    lines = []
    for obj, address in lookups:
        q = _quoted(obj)
        if q is not None and os.path.exists(obj):
            asked.append((obj, address))
            lines.append(f"{q} {address:#x}\n")
    if not asked:
        return Result(frames, TOOL)
    answers, why = _session(tool).ask(lines)
    if answers is None:
        return Result(frames, "none", f"{TOOL} failed ({why}): functions are shown as "
                      "object+offset")
    for key, text in zip(asked, answers):
        try:
            frames[key] = _frames(json.loads(text), *key)
        except (ValueError, AttributeError, TypeError):
            pass
    return Result(frames, TOOL)


class _Session:
    """One llvm-symbolizer kept running for the run's lookups (the sites at the peak, the
    mappings', the heap maps' pinners): it reads each object's symbols once; a process per
    lookup read python3's twice, 0.3 s of a 1.8 s run. A line in, one JSON line out, flushed
    per line; a writer thread feeds it so that neither side waits on a full pipe."""

    def __init__(self, tool: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEBUGINFOD")}  # no network
        import tempfile
        self.err = tempfile.TemporaryFile()   # its warnings, unbounded: a pipe could fill
        self.p = subprocess.Popen([tool, "--output-style=JSON", "--inlines", "--demangle"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.err, env=env)
        self.tool = tool

    def ask(self, lines: list) -> tuple:
        """(answers, "") or (None, why) for the query lines, within TIMEOUT_S."""
        import select
        import threading
        import time

        def feed():
            try:
                self.p.stdin.write("".join(lines).encode())
                self.p.stdin.flush()
            except (OSError, ValueError):
                pass
        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        deadline, out, buf = time.monotonic() + TIMEOUT_S, [], b""
        fd = self.p.stdout.fileno()
        while len(out) < len(lines):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                return None, f"ran past {TIMEOUT_S} s"
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.close()
                self.err.seek(0)
                err = self.err.read(4096).decode(errors="replace").strip().splitlines()
                return None, f"exit {self.p.returncode}" + (f": {err[0][:100]}" if err else "")
            buf += chunk
            *done, buf = buf.split(b"\n")
            out += [x.decode(errors="replace") for x in done]
        writer.join()
        return out, ""

    def close(self) -> None:
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


_SESSIONS: dict = {}


def _session(tool: str) -> _Session:
    """The running session for tool, started on first use, ended at exit."""
    s = _SESSIONS.get(tool)
    if s is None or s.p.poll() is not None or s.p.stdin.closed:
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

    def ask(self, lines):
        return None, self.why


def _close_all() -> None:
    for s in list(_SESSIONS.values()):
        s.close()
    _SESSIONS.clear()
