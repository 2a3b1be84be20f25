"""How a command ends: its exit codes, and the one line it prints when it cannot do its job."""

from __future__ import annotations

from notifyq.errors import NotifyQError
from notifyq.process import one_line

#: The command could not do its job (stderr says why, in one line).
EXIT_ERROR = 1
#: Bad arguments (argparse's usage, then one line).
EXIT_USAGE = 2
#: ``notifyq wait``: the job ended without completing (failed or cancelled).
EXIT_JOB_FAILED = 3
#: ``notifyq wait``: --timeout passed before the job ended (the code of timeout(1)).
EXIT_TIMEOUT = 124
#: Stopped by Ctrl-C before it finished.
EXIT_INTERRUPTED = 130


class Failed(NotifyQError):
    """A command could not do its job; the message says why, and ``exit_code`` how the
    command exits (EXIT_ERROR unless the command documents another)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.exit_code = exit_code


__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_JOB_FAILED",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "Failed",
    "one_line",
]
