"""The scenarios, one module each, and the registry that ``notifyq bench --scenario`` reads.

Each scenario module has a ``run(ctx)`` that takes the :class:`Context`, measures, and adds
figures and raw data to ``ctx.results``, and a ``SCENARIO`` that names it for the registry below;
:mod:`~notifyq_bench.scenarios.context` and :mod:`~notifyq_bench.scenarios.measure` hold what
they share. A new scenario is a module and one line in :data:`SCENARIOS`.

Timing rules they share: workers, servers and the bare loop are started first and waited for
("ready" in their log, or a health check), and only then does the clock start; throughput is
taken from the table itself (first ``started_at`` to last ``finished_at``), so neither process
start nor the bench's own polling counts; pickup latency is the handler's wall-clock stamp minus
the time the submitter's COMMIT returned, both on this host. Where a time starts or ends at
something the database did (a parent's end, a job's end), it is that row's ``finished_at``
against a wall-clock stamp of this host: the ``workflow`` scenario checks first that the
database's clock is this host's.
"""

from __future__ import annotations

from notifyq_bench.scenarios import (
    api,
    batch,
    bulk_insert,
    concurrency,
    durable,
    fair,
    history,
    horizon,
    insert_trigger,
    latency,
    lean,
    memory,
    multihost,
    throughput,
    workflow,
)
from notifyq_bench.scenarios.context import Context, Scenario, Sizes

__all__ = ["SCENARIOS", "Context", "Scenario", "Sizes"]

#: Scenarios by name, in the order they run (also with ``--scenario`` naming them in another).
SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        lean.SCENARIO,
        horizon.SCENARIO,
        latency.SCENARIO,
        throughput.SCENARIO,
        memory.SCENARIO,
        api.SCENARIO,
        batch.SCENARIO,
        insert_trigger.SCENARIO,
        bulk_insert.SCENARIO,
        history.SCENARIO,
        concurrency.SCENARIO,
        workflow.SCENARIO,
        durable.SCENARIO,
        fair.SCENARIO,
        multihost.SCENARIO,
    )
}
