"""The code that starts, samples, reads or attaches to a live process: the measured run
(measure, launch), the sampler and its fast reader (sampler, readloop, procfs), attach and
watching (attach, watching, gdbcall), and compare's runs (comparison). The analysis of a
captured run and every output format read what it captured and never import it (a layer
test: tests/unit/test_layers.py)."""
