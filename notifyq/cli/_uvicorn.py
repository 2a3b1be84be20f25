"""uvicorn's server as ``notifyq serve`` and ``notifyq dev`` run it (imported by them only:
it brings uvicorn)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Generator
from types import FrameType

import uvicorn

from notifyq.process import hard_exit


class Server(uvicorn.Server):
    """uvicorn's server, except that a graceful stop exits 0 instead of re-raising the
    signal, and a second signal exits at once."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            hard_exit(128 + sig)
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
