"""The blocking client without a database: its public name, and its refusal without a URL.

The tests here need no database; those that do are in tests/test_sync_queue.py.
"""

from __future__ import annotations

import pytest

import notifyq
from notifyq import Queue, SyncQueue
from notifyq.errors import ConfigurationError


def test_without_a_database_url_it_refuses_as_queue_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with pytest.raises(ConfigurationError) as sync_refusal:
        SyncQueue()
    with pytest.raises(ConfigurationError) as async_refusal:
        Queue()
    assert str(sync_refusal.value) == str(async_refusal.value)


def test_public_name_is_exported() -> None:
    assert "SyncQueue" in notifyq.__all__
    assert notifyq.SyncQueue is SyncQueue
