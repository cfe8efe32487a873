"""heapsight ends without the interpreter's teardown (35 ms of every run's wall here: every
module imported, numpy's too, torn down one by one), and loses nothing by it: its exit
handlers run, what it wrote is flushed, its exit code is the one it meant, and a thread of
its own that is not a daemon is still waited for."""

import subprocess
import sys

PROLOGUE = "import atexit, os, sys, threading, time\nfrom heapsight.__main__ import exit_now\n"


def _python(code: str, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROLOGUE + code], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=60)


def test_exit_handlers_run_and_buffered_output_is_written():
    r = _python("atexit.register(lambda: print('handler ran', flush=True))\n"
                "sys.stdout = open(1, 'w', buffering=1 << 16)\n"   # nothing flushed by itself
                "sys.stdout.write('written before the exit')\n"
                "sys.stderr.write('and to stderr')\n"
                "exit_now(7)\n"
                "print('never reached')\n")
    assert r.returncode == 7, r
    assert "written before the exit" in r.stdout and "handler ran" in r.stdout
    assert "never reached" not in r.stdout
    assert "and to stderr" in r.stderr


def test_a_thread_that_is_not_a_daemon_is_waited_for():
    # (the thread ends only once it is told, after exit_now returned: no timing involved)
    r = _python("told = threading.Event()\n"
                "def late():\n    told.wait()\n    print('the thread finished', flush=True)\n"
                "threading.Thread(target=late).start()\n"
                "exit_now(0)\n"
                "print('the ordinary exit', flush=True)\n"
                "told.set()\n")
    assert r.returncode == 0, r
    assert r.stdout.splitlines() == ["the ordinary exit", "the thread finished"]


def test_a_stdout_that_cannot_be_written_still_fails_the_exit(tmp_path):
    # /dev/full: the flush fails; the ordinary exit then reports it (exit code 120), as
    # Python does for any program whose output was lost
    with open("/dev/full", "w") as full:
        r = _python("sys.stdout = open(1, 'w', buffering=1 << 16)\n"
                    "sys.stdout.write('x' * 10)\nexit_now(0)\n", stdout=full)
    assert r.returncode == 120, r


def test_the_console_script_ends_through_it():
    # a heapsight command ends in os._exit with the command's code once its output is out
    r = _python("def fake_exit(rc):\n"
                "    sys.stdout.flush()\n"
                "    print(f'os._exit({rc})', flush=True)\n"
                "    raise SystemExit(99)\n"
                "os._exit = fake_exit\n"
                "import heapsight.__main__ as m\n"
                "sys.argv = ['heapsight', 'run', '-q', '--no-save', '--', 'sh', '-c', 'exit 3']\n"
                "m.run_main()\n")
    assert r.returncode == 99, r
    assert r.stdout.strip().splitlines()[-1] == "os._exit(3)"
