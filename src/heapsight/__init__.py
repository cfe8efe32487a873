"""heapsight: why a process's memory did not go back to the OS after free()."""

__version__ = "0.1.0"
