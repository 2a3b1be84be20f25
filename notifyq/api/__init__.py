"""The HTTP API: ``create_app(settings)`` builds the FastAPI app.

``uvicorn notifyq.api:app`` builds the app from the environment on first access. Nothing is
imported eagerly: importing a part of this package that needs no web framework (the models of
:mod:`notifyq.api.schemas`, which the CLI prints jobs with) must not import FastAPI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from notifyq.api.application import create_app

__all__ = ["create_app"]

_app: FastAPI | None = None


def __getattr__(name: str) -> Any:
    """``create_app``, imported on first use; and ``app``, built from the environment when
    uvicorn first asks for it: bad or missing settings end the process with one line saying
    what to set."""
    global _app
    if name == "create_app":
        from notifyq.api.application import create_app

        return create_app
    if name == "app":
        if _app is None:
            from notifyq.api.application import create_app
            from notifyq.errors import ConfigurationError

            try:
                _app = create_app()
            except ConfigurationError as exc:
                raise SystemExit(f"notifyq: error: {exc}") from None
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
