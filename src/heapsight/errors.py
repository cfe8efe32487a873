"""The one exception type the CLI reports: a message for the user and an exit code."""


class HeapsightError(Exception):
    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
