"""`heapsight lab perl`: Perl strings, arrays and hashes against glibc's 128 KiB mmap line,
measured on this machine (small sizes)."""

import json
import shutil
import subprocess
import sys

import pytest

from heapsight.allocators import PRESET, Config
from heapsight.lab import common
from heapsight.lab import perl as lab
from heapsight.lab.common import Context

PERL = shutil.which("perl")
SCRIPT = common.lab_program("hs-lab-perl.pl")
GLIBC = PRESET["glibc"]
PROBE_COUNT = 100   # about 12 MiB per probe: far above RSS noise, quick to build


def quiet(_msg):
    pass


def run_case(case, scale, cfg=GLIBC):
    out = common.run_program([PERL, SCRIPT, "--case", str(case), "--scale", str(scale)], cfg)
    assert len(out) == 1 and out[0]["case"] == case
    return out[0]


def probe(length, rounds=1, cfg=GLIBC, count=PROBE_COUNT):
    return lab.probe(quiet, PERL, SCRIPT, cfg, length, count, rounds)


@pytest.fixture(scope="module")
def boundary(cli):
    """The boundary search of the quick run (one fresh perl per probe, under glibc)."""
    p, doc = cli
    assert p.returncode == 0, p.stderr
    return doc["experiments"][0]["data"]["probe"]


@pytest.fixture(scope="module")
def cli():
    p = subprocess.run([sys.executable, "-m", "heapsight", "lab", "perl", "--quick", "--no-save",
                        "--configs", "glibc", "--json", "-"],
                       capture_output=True, text=True, timeout=300)
    doc = json.loads(p.stdout) if p.stdout.strip().startswith("{") else None
    return p, doc


def test_boundary_is_located_near_128_kib(boundary):
    # GIVEN glibc's default mmap threshold of 128 KiB
    # WHEN the binary search probes string lengths around it, one fresh perl each
    # THEN it finds one length in the window, with no error
    assert boundary["error"] is None, boundary["error"]
    assert isinstance(boundary["boundary"], int)
    assert abs(boundary["boundary"] - lab.KIB128) <= lab.PROBE_WINDOW


def test_one_character_below_the_boundary_stays_and_at_it_goes_back(boundary):
    # GIVEN the located boundary L
    n = boundary["boundary"]
    # WHEN arrays of L-1 and of L characters are built and freed in fresh processes
    below, at = probe(n - 1)[0], probe(n)[0]
    # THEN leaving the block keeps the first and gives the second back
    assert lab.outcome(below) == "kept", below
    assert lab.outcome(at) == "gave back", at


def test_the_boundary_is_where_perls_buffer_makes_a_128_kib_chunk(boundary):
    # GIVEN the buffer sizes Perl asked malloc for on both sides of the boundary
    runs = {r["len"]: r for r in boundary["runs"]}
    n = boundary["boundary"]
    # WHEN glibc's chunk size is worked out from them
    below, at = lab.chunk_size(runs[n - 1]["svlen"]), lab.chunk_size(runs[n]["svlen"])
    # THEN the chunks cross 128 KiB exactly there
    assert below < lab.KIB128 <= at


def test_writeup_case_4_goes_back_here_like_case_5(boundary):
    # GIVEN this machine's boundary lies below the write-up's 128 KiB - 14 characters
    assert boundary["boundary"] <= lab.KIB128 - 14
    # WHEN the write-up's cases 4 and 5 run (200 strings instead of 1000)
    c4, c5 = run_case(4, 0.2), run_case(5, 0.2)
    # THEN both give back most of their memory on leaving the block
    assert lab.grew(c5) > 20 * common.MIB and lab.outcome(c5) == "gave back", c5
    assert lab.grew(c4) > 20 * common.MIB and lab.outcome(c4) == "gave back", c4


def test_a_plain_block_keeps_the_string_that_the_cases_block_gives_back():
    # GIVEN case 2's 20 M-character string, once in the case's own (eval) block and once
    # in a plain block compiled with the script (case 12)
    in_eval, plain = run_case(2, 0.2), run_case(12, 0.2)
    assert in_eval["facts"]["length"] == plain["facts"]["length"] == 20_000_000
    # THEN the eval's lexical is freed and given back; the plain block's keeps its buffer
    assert lab.outcome(in_eval) == "gave back", in_eval
    assert lab.kept(plain) > 18 * common.MIB, plain


def test_two_hashes_with_the_same_keys_take_less_than_with_different_keys():
    # GIVEN cases 7 and 8 with 50,000 keys per hash
    different, same = run_case(7, 0.05), run_case(8, 0.05)
    assert same["facts"]["keys"] == different["facts"]["keys"] == 50_000
    # THEN sharing the keys saves at least the claim's threshold
    assert lab.grew(same) < (1 - lab.SHARED_SAVING_MIN) * lab.grew(different)


def test_glibc_keeps_a_rebuilt_array_and_a_fixed_threshold_does_not():
    # GIVEN 50 strings of 1 M characters built and freed six times in one process
    dynamic = probe(lab.REPEAT_LEN, 6, GLIBC, lab.REPEAT_COUNT)
    fixed = probe(lab.REPEAT_LEN, 6, PRESET["glibc-mmap128k"], lab.REPEAT_COUNT)
    # THEN the first round goes back everywhere, a later one stays under the default
    # (dynamic) threshold, and none does under a fixed one
    assert lab.outcome(dynamic[0]) == "gave back"
    assert any(lab.outcome(r) == "kept" for r in dynamic[1:]), dynamic
    assert all(lab.outcome(r) == "gave back" for r in fixed), fixed


@pytest.mark.parametrize("args", [["--case", "13"], ["--case", "1", "--probe", "5"], [],
                                  ["--bogus"], ["--case", "2", "--scale", "0"], ["extra"]])
def test_bad_arguments_exit_2(args):
    p = subprocess.run([PERL, SCRIPT, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage:" in p.stderr and not p.stdout


def test_missing_allocator_is_an_error_row_and_the_rest_runs():
    # GIVEN a configuration whose library does not exist
    broken = Config("broken", "jemalloc", {}, "missing", library="/nonexistent/libjemalloc.so.2")
    # WHEN the experiment runs with it alone
    data = lab.collect(Context(quick=True, configs=[broken]))
    data = json.loads(json.dumps(data))   # as the report reads it back
    # THEN that row holds the error, the glibc probes still ran, and everything renders
    assert "missing" in data["configs"][0]["error"]
    assert data["probe"]["boundary"] is not None
    titles = [t.title for t in lab.tables(data)]
    assert "broken: not run" in titles
    assert len(lab.claims(data)) == 5 and lab.charts(data)


def test_cli_quick_run_exits_0_and_prints_the_claims(cli):
    p, doc = cli
    assert p.returncode == 0, p.stderr
    flat = " ".join(p.stderr.split())   # (a claim wraps to the terminal's width)
    assert "claims:" in p.stderr and "the boundary is at 128 KiB - 13 characters" in flat
    assert doc["experiments"][0]["name"] == "perl"


def test_claims_are_recomputed_alike_from_saved_data(cli):
    # GIVEN the results a quick run saved
    _, doc = cli
    exp = doc["experiments"][0]
    # WHEN the claims are computed again from the data alone
    again = [c.to_dict() for c in lab.claims(exp["data"])]
    # THEN they are the same
    assert again == exp["claims"]
    assert len(lab.charts(exp["data"])) >= 3
