"""Every scenario file has a cluster of its own (module scope): the files run side by side in
pytest-xdist's processes (``--dist loadfile``) without sharing a server they stop or kill."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.cluster import Cluster, own_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    with own_cluster() as started:
        yield started
