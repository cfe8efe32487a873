"""The one exception type the CLI reports: a message for the user and an exit code."""

# A CI gate failed (run's --fail-if-*, diff's --fail-if-grew): the figure is above its limit.
EXIT_GATE = 90
# A gate could not be judged: the run lacks its figure (--fail-if-lost without reachability).
# A CI job must not pass on a check that was never made.
EXIT_UNJUDGED = 2


class HeapsightError(Exception):
    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
