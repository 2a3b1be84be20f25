"""The ``notifyq`` command line: :func:`main` is the console script and ``python -m notifyq``.

Inside, private modules by concern, each importing only those listed before it:

- ``_errors``: exit codes, :class:`Failed`, the one line a failure prints.
- ``_output``: progress lines, and the tables of queues, jobs and tasks.
- ``_args``: each command's arguments as a typed value.
- ``_parser``: the grammar (commands, flags, their types) that fills those values.
- ``_uvicorn``: the HTTP server of ``serve`` and ``dev``.
- ``_running``: ``migrate``, ``worker``, ``serve``, ``dev``.
- ``_jobs``: ``enqueue``, ``status``, ``wait``, ``jobs``, ``retry``, ``cancel``, ``prune``.
- ``_queues``: ``queue``, ``stats``, ``top``, ``tasks``.
- ``_roles``: ``grant``.
- ``_main``: :func:`main` and the table of commands.

Settings are built at the entry point, from the environment and the flags, and passed down;
where the database comes from is :mod:`notifyq.bootstrap`'s rule. Signals, the heap and the
worker process itself are :mod:`notifyq.process`'s, which Django's command shares.
"""

from notifyq.cli._main import main

__all__ = ["main"]
