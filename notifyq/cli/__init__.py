"""The ``notifyq`` command line (the console script and ``python -m notifyq``)."""

from notifyq.cli._main import main

__all__ = ["main"]
