"""One error model for every expected failure.

Every failure a user can cause or meet (a bad spec, missing data, a model that cannot be loaded, a
damaged or busy store, a refusing server, a missing device) raises a subclass of `WorkbenchError`.
The CLI prints it as one line (what, where, the fix) and exits with its `exit_code`: 2 for bad
input, 1 for runtime faults; `-v` adds the traceback. Anything else is a bug and keeps its
traceback. This module imports nothing, so every layer (the torch-free analysis side too) can use it.
"""

from __future__ import annotations

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1
EXIT_SIGINT = 130  # 128 + SIGINT, what shells report for Ctrl-C
EXIT_SIGTERM = 143  # 128 + SIGTERM


class WorkbenchError(Exception):
    """An expected failure. `hint` is the fix, printed after the message."""

    exit_code = EXIT_RUNTIME

    def __init__(self, message: str = "", *, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def user_message(self) -> str:
        text = str(self) or type(self).__name__
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class BadInputError(WorkbenchError):
    """The input is wrong (spec, data, model id, path, argument): fixing it is the user's move."""

    exit_code = EXIT_BAD_INPUT


class DataError(BadInputError):
    """Samples cannot be loaded (a missing file or image, bad JSON, an unreachable dataset)."""


class ModelError(BadInputError):
    """A model cannot be loaded or is not supported."""


class DeviceError(BadInputError):
    """The requested device is not available."""


class StoreError(WorkbenchError):
    """A store cannot be used as asked (busy, inconsistent with the spec, damaged, unwritable)."""


class StorePathError(StoreError, BadInputError):
    """The store path itself is unusable (a file, a foreign directory, inside another store)."""

    exit_code = EXIT_BAD_INPUT


class RemoteError(WorkbenchError):
    """A remote run stopped. Everything already written to the store is kept; rerun to resume."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so both stop a run the same way."""


class Interrupted(WorkbenchError):
    """A run stopped by Ctrl-C (exit 130) or SIGTERM (143). Every stored sample is complete (a write
    in progress finishes first); rerunning resumes."""

    def __init__(self, message: str, *, terminated: bool = False):
        super().__init__(message)
        self.exit_code = EXIT_SIGTERM if terminated else EXIT_SIGINT
