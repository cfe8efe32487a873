"""Unit tier: pure functions, no process started. A package, so that a file here may share
its name with a scenario test in tests/ (tests/unit/test_allocators.py, tests/test_allocators.py)."""
