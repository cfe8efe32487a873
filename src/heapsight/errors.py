"""The one exception type the CLI reports: a message for the user and an exit code."""

# A CI gate failed (run's --fail-if-*, diff's --fail-if-grew): the figure is above its limit.
EXIT_GATE = 90


class HeapsightError(Exception):
    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
