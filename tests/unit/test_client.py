"""The Python client's public names.

The tests here need no database; those that do are in tests/test_client.py.
"""

from __future__ import annotations

import notifyq
from notifyq import Queue


def test_public_names_are_exported() -> None:
    for name in notifyq.__all__:
        assert getattr(notifyq, name) is not None
    assert notifyq.Queue is Queue
