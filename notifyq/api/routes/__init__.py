"""The API's routers, one per resource: :mod:`.jobs`, :mod:`.queues`, and :mod:`.ops` (health,
readiness, metrics, tasks, the dashboard). The submission routes are in
:mod:`notifyq.api.fast`."""
