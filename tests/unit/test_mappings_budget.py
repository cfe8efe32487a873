"""How often the sampler reads the program's mappings (/proc/PID/smaps) as it grows: a
reading walks the program's page tables under its mmap lock, and the program's brk or mmap
waits for it (live/sampler.py, LOCK_SHARE). Driven here by a made-up clock and a program
whose RSS grows steadily, then holds: the reading costs what smaps cost at that size here
(8 ms at 400 MiB)."""

import math

from heapsight.live import sampler as smp
from heapsight.timeline import COLUMNS, IDX, Timeline

MiB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def drive(monkeypatch, grow_s=1.5, top=400 * MiB, hold_s=0.3, hz=100):
    """The readings (time, RSS, cost) over a run that grows linearly to top in grow_s, then
    holds for hold_s, sampled at hz; and the timeline."""
    clock = Clock()
    monkeypatch.setattr(smp.time, "monotonic", clock.monotonic)
    s = smp.Sampler.__new__(smp.Sampler)
    s.timeline, s.segment = Timeline(), None
    readings, rss = [], [0.0]

    def kinds():
        cost = smp.LOCK_S_PER_MIB * rss[0] / MiB   # smaps: 20 us per MiB resident
        readings.append((clock.now, rss[0], cost))
        clock.now += cost
        return {"heap": int(rss[0]), "anon": 0}, []

    s._kinds = kinds
    start = clock.now
    c = smp._Carry(start)
    for k in range(int((grow_s + hold_s) * hz)):
        clock.now = start + k / hz
        t = k / hz
        rss[0] = top * min(1.0, t / grow_s) + MiB
        row = [math.nan] * len(COLUMNS)
        row[IDX["t"]], row[IDX["rss"]] = t, rss[0]
        s._read_mappings(row, clock.now, start, c)
        s.timeline.append_rows([row])
    return readings, s.timeline


def test_a_growing_program_is_read_in_proportion_to_what_a_reading_costs(monkeypatch):
    # GIVEN a program growing steadily to 400 MiB in 1.5 s (a new high of 10% every few
    # ticks), then holding
    readings, tl = drive(monkeypatch)
    growth = [r for r in readings if r[0] - 1000.0 < 1.5]
    # THEN the readings while it grows hold its lock for 1% of that time and the 10 ms
    # allowed to start with (at each new high they were 4.9%: 31 readings, 73 ms of 1.5 s;
    # 20 and 21 ms now), however many highs it passes
    held = sum(cost for _, _, cost in growth)
    assert held < 0.01 * 1.5 + 0.01 + 0.001, (len(growth), held)
    # AND the reading the peak's breakdown is taken from is at the top, once RSS stops
    # growing (the hold), not the last one of the growth
    t, _, peak_rss = tl.kinds_peak
    assert peak_rss == 401 * MiB, tl.kinds_peak
    assert 1.5 <= t <= 1.55, tl.kinds_peak


def test_a_short_program_is_read_at_every_new_high(monkeypatch):
    # GIVEN a program growing to 70 MiB in 0.6 s and ending there (sqlite3 building an
    # index: with a wait of 100 times each read's time as the sampler measured it, its last
    # reading came at 40 of 73 MiB)
    readings, tl = drive(monkeypatch, top=70 * MiB, grow_s=0.6, hold_s=0.0)
    # THEN every new high of 10% is read as with no limit (a reading costs 1.4 ms at most;
    # 17 readings here, the last at 63 of 71 MiB: the next high would be 70.1)
    monkeypatch.setattr(smp, "LOCK_ALLOWANCE_S", 1e9)
    unlimited, _ = drive(monkeypatch, top=70 * MiB, grow_s=0.6, hold_s=0.0)
    assert readings == unlimited and len(readings) == 17
