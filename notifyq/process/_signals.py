"""The edges of a long-running process: SIGTERM and SIGINT, the hard exit a second signal
asks for, and the handler threads a process may not wait for at exit."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

import anyio

logger = logging.getLogger("notifyq")

#: Run, innermost first, when a second signal ends the process at once: os._exit skips the
#: ``with`` blocks that would have run them.
_CLEANUPS: list[Callable[[], None]] = []


@contextlib.contextmanager
def before_hard_exit(cleanup: Callable[[], None]) -> Iterator[None]:
    """Runs ``cleanup`` (best effort) if the process exits at once while the block runs."""
    _CLEANUPS.append(cleanup)
    try:
        yield
    finally:
        _CLEANUPS.remove(cleanup)


def hard_exit(code: int) -> NoReturn:
    """Ends the process now, after the cleanups of :func:`before_hard_exit`."""
    for cleanup in reversed(_CLEANUPS):
        with contextlib.suppress(Exception):
            cleanup()
    logging.shutdown()
    os._exit(code)


async def stop_on_signals(stop: Callable[[], None]) -> None:
    """The first SIGTERM/SIGINT stops gracefully; a second one exits at once (leases then
    bring the interrupted jobs back)."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        received = 0
        async for signum in signals:
            received += 1
            if received == 1:
                logger.info(
                    "received %s: draining (send it again to exit at once)",
                    signal.Signals(signum).name,
                )
                stop()
            else:
                logger.warning("received %s again: exiting at once", signal.Signals(signum).name)
                hard_exit(128 + signum)


def exit_now_if_threads_hang() -> None:
    """A plain-function handler that ran past the shutdown grace was abandoned in its thread
    (threads cannot be cancelled) and its job requeued. Python would wait for that thread at
    exit; exit without it instead, as the job is already back in the queue."""
    deadline = time.monotonic() + 0.5
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.daemon and t.is_alive()
    ]
    if stuck:
        logger.warning("exiting without %d handler thread(s) that are still running", len(stuck))
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
