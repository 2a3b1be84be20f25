"""The listener: one dedicated LISTEN connection per process, kept alive and reconnected.

NOTIFY is only a hint. The listener never reads jobs; it calls the handlers subscribed to each
channel with the notification's payload (``notifyq``: a queue has new work; ``notifyq_cancel``:
a job id to stop; ``notifyq_job``: a watched job changed) and its ``on_connect`` callbacks after
every (re)connect, because notifications sent while it was away are gone and a subscriber must
look at the table once. It probes the connection when nothing arrived for a while, so a dead
TCP connection cannot pass for a quiet one.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import psycopg
from anyio.abc import TaskStatus
from psycopg import sql

from notifyq.db import closing, first_line, is_connection_error, open_connection, redact
from notifyq.errors import ConfigurationError, DatabaseUnavailable

logger = logging.getLogger(__name__)

#: New work in the queue named by the payload.
CHANNEL = "notifyq"
#: Stop the running job whose id is the payload.
CANCEL_CHANNEL = "notifyq_cancel"
#: The job whose id is the payload changed, and someone watches it (see notifyq.watching).
JOB_CHANNEL = "notifyq_job"
#: A listener's proof, at each (re)connect, that notifications reach it.
PROBE_CHANNEL = "notifyq_probe"

#: Seconds a listener waits for its own probe to come back.
PROBE_WAIT = 3.0
#: Why a LISTEN connection hears nothing, and what to do.
POOLED = (
    "it goes through a transaction-mode pooler (PgBouncer, Supavisor), which accepts LISTEN "
    "and then hands the server connection to other clients; point NOTIFYQ_LISTEN_URL at the "
    "server directly or at a session-mode pool"
)


class Listener:
    """Holds LISTEN on its own autocommit connection for ``channels``, and hands each
    notification to the handlers subscribed to its channel (any number: one connection per
    process, fanned out in memory)."""

    def __init__(
        self,
        url: str,
        *,
        channels: Sequence[str] = (CHANNEL, CANCEL_CHANNEL),
        connect_kwargs: dict[str, Any],
        probe_interval: float = 5.0,
        probe_wait: float = PROBE_WAIT,
        max_backoff: float = 2.0,
    ) -> None:
        self._url = url
        self._handlers: dict[str, list[Callable[[str], None]]] = {c: [] for c in channels}
        self._on_connect: list[Callable[[], None]] = []
        self._kwargs = {**connect_kwargs, "autocommit": True}
        # The listener must not inherit the pool's statement timeout (it only waits), but keeps
        # a search_path that no other role can write to.
        self._kwargs["options"] = "-c search_path=pg_catalog,pg_temp"
        self._probe_interval = probe_interval
        #: Seconds a connect waits for its own notification to come back (see _prove_delivery).
        self._probe_wait = probe_wait
        self._max_backoff = max_backoff
        self.connected = False
        self.reconnects = 0
        self.notifications = 0
        self.last_seen = 0.0

    def subscribe(self, channel: str, handler: Callable[[str], None]) -> Callable[[], None]:
        """Calls ``handler(payload)`` for each notification on ``channel`` (one of the
        listener's channels); answers the function that unsubscribes it."""
        handlers = self._handlers[channel]
        handlers.append(handler)
        return lambda: handlers.remove(handler)

    def on_connect(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls ``callback()`` after every (re)connect, once LISTEN is live: notifications
        sent while the listener was away are gone, so the subscriber must look at the table.
        Answers the function that removes it."""
        self._on_connect.append(callback)
        return lambda: self._on_connect.remove(callback)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listens until cancelled. Reports started once the first LISTEN is live; raises
        DatabaseUnavailable if that first connection fails, then reconnects forever."""
        started = False
        backoff = 0.1
        while True:
            try:
                conn = await open_connection(self._url, **self._kwargs)
            except psycopg.OperationalError as exc:
                if not started:
                    raise DatabaseUnavailable(
                        f"cannot open the LISTEN connection to {redact(self._url)}: "
                        f"{first_line(exc)}"
                    ) from exc
                logger.warning(
                    "listener: reconnect failed (%s); retrying in %.1fs", first_line(exc), backoff
                )
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            try:
                async with closing(conn):
                    await self._listen(conn)
                    backoff = 0.1
                    if started:
                        self.reconnects += 1
                        logger.info("listener: reconnected")
                    else:
                        started = True
                        task_status.started()
                    for callback in list(self._on_connect):
                        callback()
                    await self._receive(conn)
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                logger.warning("listener: connection lost (%s); reconnecting", first_line(exc))
            finally:
                self.connected = False

    async def _listen(self, conn: psycopg.AsyncConnection[Any]) -> None:
        for channel in self._handlers:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        cursor = await conn.execute(
            "SELECT pg_catalog.array_agg(c) FROM pg_catalog.pg_listening_channels() AS c"
        )
        row = await cursor.fetchone()
        if not row or not set(self._handlers) <= set(row[0] or ()):
            raise ConfigurationError(f"LISTEN did not take effect on this connection: {POOLED}")
        await self._prove_delivery(conn)
        self.connected = True
        self.last_seen = time.monotonic()

    async def _prove_delivery(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Sends a notification from another connection and waits for it here. Behind a
        transaction-mode pooler the LISTEN above, and the look at pg_listening_channels(),
        may both have run on a server connection that is now another client's: only a
        notification that arrives while this connection is idle proves it listens."""
        token = secrets.token_hex(8)
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))
        try:
            other = await open_connection(
                self._url, **{**self._kwargs, "application_name": "notifyq-listener-probe"}
            )
            async with closing(other):
                await other.execute("SELECT pg_catalog.pg_notify(%s, %s)", [PROBE_CHANNEL, token])
            deadline = time.monotonic() + self._probe_wait
            while (left := deadline - time.monotonic()) > 0:
                # Closed at once when left early: the generator holds the connection's lock.
                async with contextlib.aclosing(conn.notifies(timeout=left)) as arrived:
                    async for notify in arrived:
                        if notify.channel != PROBE_CHANNEL:
                            self._dispatch(notify)
                        elif notify.payload == token:
                            return
            raise ConfigurationError(
                f"a notification sent to this LISTEN connection did not arrive within "
                f"{self._probe_wait:g} s: {POOLED}"
            )
        finally:
            await conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(PROBE_CHANNEL)))

    def _dispatch(self, notify: psycopg.Notify) -> None:
        self.notifications += 1
        self.last_seen = time.monotonic()
        for handler in self._handlers.get(notify.channel, ()):
            handler(notify.payload)

    async def _receive(self, conn: psycopg.AsyncConnection[Any]) -> None:
        while True:
            async for notify in conn.notifies(timeout=self._probe_interval):
                self._dispatch(notify)
            # Quiet for a probe interval: make sure the connection is still alive. A dead peer
            # makes this fail (keepalives bound the wait) instead of waiting forever.
            with anyio.fail_after(self._probe_interval + 5):
                await conn.execute("SELECT 1")
            self.last_seen = time.monotonic()
