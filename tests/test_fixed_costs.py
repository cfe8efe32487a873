"""What a run pays for numpy at its end: heapsight's median and isin give numpy's answers
without importing numpy.ma, which np.median and np.isin do on their first call (25-30 ms of
every run's end, for a masked-array check heapsight never needs). Each check runs in a
fresh interpreter: the import is the outcome."""

import subprocess
import sys


def _python(code: str) -> None:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_median_and_isin_leave_numpy_ma_unimported():
    _python("import sys, numpy as np\n"
            "from heapsight.arrays import isin, median\n"
            "median(np.arange(5.0)); isin(np.arange(9), [1, 2])\n"
            "assert 'numpy.ma' not in sys.modules, 'numpy.ma was imported'\n")


def test_median_and_isin_agree_with_numpys():
    _python("import numpy as np\n"
            "from heapsight.arrays import isin, median\n"
            "r = np.random.default_rng(7)\n"
            "for n in (1, 2, 7, 1000):\n"
            "    a = r.normal(size=n)\n"
            "    assert median(a) == np.median(a), n\n"
            "assert str(median([1.0, float('nan'), 2.0])) == 'nan' and str(median([])) == 'nan'\n"
            "a = r.integers(0, 50, 5000).astype(np.uint64)\n"
            "for v in ([], [3], [49, 0, 7, 7], list(range(0, 60, 3))):\n"
            "    assert (isin(a, v) == np.isin(a, v)).all(), v\n")


def test_a_full_runs_end_leaves_numpy_ma_unimported(tmp_path):
    # the whole end of a run that samples, maps, marks and saves
    _python("import sys\n"
            "import heapsight.__main__ as m\n"
            f"sys.argv = ['heapsight', 'run', '-q', '-o', {str(tmp_path / 'r.json.gz')!r}, '--',\n"
            "            sys.executable, '-c', 'd = [dict(k=i) for i in range(30000)]']\n"
            "rc = m.main()\n"
            "assert rc == 0, rc\n"
            "assert 'numpy.ma' not in sys.modules, 'numpy.ma was imported'\n")


def test_the_program_starts_before_heapsight_imports_what_only_the_analysis_needs():
    # what is imported when the program is started is what it waited for: numpy, the
    # dataclasses module (with inspect and ast: 10-25 ms here), subprocess, json and gzip
    # come after it, while it runs
    _python("import sys\n"
            "import heapsight.__main__ as m\n"
            "from heapsight.live import launch\n"
            "seen = []\n"
            "real = launch.start\n"
            "def start(*a, **k):\n"
            "    seen.append(set(sys.modules))\n"
            "    return real(*a, **k)\n"
            "launch.start = start\n"
            "sys.argv = ['heapsight', 'run', '-q', '--no-save', '--', 'true']\n"
            "assert m.main() == 0\n"
            "early = seen[0] & {'numpy', 'dataclasses', 'inspect', 'subprocess', 'json', 'gzip',\n"
            "                   'heapsight.allocators', 'heapsight.summary', 'heapsight.model'}\n"
            "assert not early, f'imported before the program started: {sorted(early)}'\n")


def test_a_frame_saved_as_dataclasses_would_save_it():
    # the record's frames are written by Frame.as_dict (dataclasses.asdict's deep copies took
    # 13.6 ms of saving node's 1,243 frames): the same keys in the same order, the same values
    import dataclasses
    from heapsight.symbolize import Frame
    for f in (Frame("parse_row", "x.c", 12, "/usr/bin/x", 0x1234),
              Frame(None, None, None, "/lib/libc.so.6", 7)):
        assert list(f.as_dict().items()) == list(dataclasses.asdict(f).items())
