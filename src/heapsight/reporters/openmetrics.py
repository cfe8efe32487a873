"""The figures of a watched process served to Prometheus on /metrics (the Prometheus
client library), named by Prometheus' conventions: base units in the name, one metric
per quantity with the part as a label.

  heapsight_memory_bytes{kind="in_use"|"retained"|"stacks"|"file_backed"|"shared"|
                         "other_anonymous"}    the split of RSS (attach)
                        {kind="live"|"waste"|"metadata"|"retained"|"non_heap"|"untouched"}
                                               the split of RSS (run)
  heapsight_rss_bytes                          resident set size
  heapsight_release_estimate_bytes             what a release would give back now
  heapsight_release_given_back_bytes           what the last --trim gave back
  heapsight_sample_timestamp_seconds           when the allocator's figures were read
each with the labels pid, command (the program's name) and allocator.
"""

from __future__ import annotations

import os

from heapsight import interrupts
from heapsight.errors import HeapsightError

KIND_LABELS = {"stacks": "stacks", "file-backed": "file_backed", "shared memory": "shared",
               "other anonymous": "other_anonymous",
               "allocator heaps ([heap], arenas)": "allocator_heaps"}


class Exporter:
    def __init__(self, addr: str, port: int):
        try:
            from prometheus_client import CollectorRegistry, Gauge, start_http_server
        except ImportError as e:
            raise HeapsightError("--openmetrics-port needs the Prometheus client library: "
                                 "pip install prometheus_client") from e
        self.registry = CollectorRegistry()
        labels = ("pid", "command", "allocator")
        self.memory = Gauge("heapsight_memory_bytes", "Resident memory by part",
                            labels + ("kind",), registry=self.registry)
        self.rss = Gauge("heapsight_rss_bytes", "Resident set size", labels, registry=self.registry)
        self.estimate = Gauge("heapsight_release_estimate_bytes",
                              "What the allocator's release would give back now", labels,
                              registry=self.registry)
        self.given = Gauge("heapsight_release_given_back_bytes",
                           "What the last measured release gave back", labels, registry=self.registry)
        self.stamp = Gauge("heapsight_sample_timestamp_seconds",
                           "When the allocator's figures were read (Unix time)", labels,
                           registry=self.registry)
        try:   # its thread starts with every signal blocked: they stay the main thread's
            with interrupts.deferred(interrupts.ALL):
                self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
            self.port = self.server.server_port   # the one bound, when port was 0
        except OSError as e:
            raise HeapsightError(f"--openmetrics-port {port}: cannot listen on {addr}:{port} "
                                 f"({e.strerror}); choose a free port") from e

    def update(self, a, rss_bytes: int | None = None) -> None:
        """a: the latest attach.Attached; rss_bytes: a newer /proc reading, if any."""
        lab = (str(a.pid), os.path.basename(a.command.split(" ")[0]), a.allocator)
        self.rss.labels(*lab).set(rss_bytes if rss_bytes is not None else a.rss_bytes)
        if a.in_use_bytes is not None:
            self.memory.labels(*lab, "in_use").set(a.in_use_bytes)
            self.memory.labels(*lab, "retained").set(a.retained_bytes)
        for name, v in a.non_heap.items():
            self.memory.labels(*lab, KIND_LABELS.get(name, name.replace(" ", "_"))).set(v)
        if a.release_estimate_bytes is not None:
            self.estimate.labels(*lab).set(a.release_estimate_bytes)
        if a.trim:
            self.given.labels(*lab).set(a.trim["gave_back_bytes"])
        self.stamp.labels(*lab).set(a.taken_at)

    def update_run(self, pid: int, command: str, allocator: str, b) -> None:
        """A run's latest sample (a Breakdown): its resident parts, as `run` splits them."""
        lab = (str(pid), os.path.basename(command), allocator)
        self.rss.labels(*lab).set(b.rss_bytes)
        for part, v in b.parts().items():
            self.memory.labels(*lab, part.replace("-", "_")).set(v)
        self.memory.labels(*lab, "untouched").set(b.untouched_bytes)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(addr: str, port: int) -> Exporter:
    return Exporter(addr, port)
