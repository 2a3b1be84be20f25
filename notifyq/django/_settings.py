"""The notifyq settings of a Django project: ``settings.NOTIFYQ`` mapped onto
:class:`notifyq.Settings`, and the database taken from ``DATABASES``.

Built when asked (by a command, the first enqueue, a system check), never at import. Keys are
notifyq's variables without their ``NOTIFYQ_`` prefix (``CONCURRENCY`` for
``NOTIFYQ_CONCURRENCY``, ``IMPORT`` for ``NOTIFYQ_IMPORT``, ``DATABASE_URL``), and two of
Django's own: ``DATABASE``, the alias of the database notifyq lives in (``"default"``), and
``AUTODISCOVER``, whether the worker imports every installed app's ``tasks`` module (True).
What NOTIFYQ does not say comes from the environment, as for ``notifyq worker``; a command's
flags win over both.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from notifyq.errors import ConfigurationError
from notifyq.settings import Settings

__all__ = [
    "autodiscover",
    "database_alias",
    "database_url_of",
    "effective_defaults",
    "notifyq_settings",
]

#: Keys of NOTIFYQ that are the Django app's own, not notifyq settings.
_DJANGO_KEYS = frozenset({"DATABASE", "AUTODISCOVER"})
#: Keys that name a setting by its variable rather than by its field.
_ALIASES = {"IMPORT": "imports"}


def notifyq_settings(**overrides: Any) -> Settings:
    """The project's notifyq settings: the environment's, under ``settings.NOTIFYQ``, under
    ``overrides`` (None: not given). Unless NOTIFYQ names a ``DATABASE_URL``, the database is
    ``DATABASES[NOTIFYQ["DATABASE"]]`` when that is PostgreSQL (the one a view's transaction
    writes to, so it wins over the environment's DATABASE_URL), else the environment's.

    Raises ImproperlyConfigured, naming the key, for an unknown key or a bad value."""
    given: dict[str, Any] = {}
    fields = Settings.model_fields
    for key, value in _conf().items():
        if key in _DJANGO_KEYS:
            continue
        name = _ALIASES.get(key, key.lower())
        if name not in fields:
            raise ImproperlyConfigured(
                f"settings.NOTIFYQ[{key!r}] is not a notifyq setting: a key is a notifyq "
                "variable without its NOTIFYQ_ prefix (CONCURRENCY for NOTIFYQ_CONCURRENCY), "
                f"or one of {', '.join(sorted(_DJANGO_KEYS))}"
            )
        given[name] = value
    if "database_url" not in given:
        url = database_url_of(database_alias())
        if url is not None:
            given["database_url"] = url
    given.update((key, value) for key, value in overrides.items() if value is not None)
    try:
        return Settings.load(**given)
    except ConfigurationError as exc:
        raise ImproperlyConfigured(
            f"notifyq: {exc} (from settings.NOTIFYQ or the environment)"
        ) from exc


def effective_defaults() -> Settings:
    """What a command runs with when its flags say nothing, for its ``--help``: the project's
    settings (NOTIFYQ, then the environment), or notifyq's own defaults when those do not load,
    which the command itself says when it runs. Opens no connection."""
    try:
        return notifyq_settings()
    except ImproperlyConfigured:
        return Settings.model_construct()


def database_alias() -> str:
    """The alias in DATABASES of the database notifyq lives in: NOTIFYQ["DATABASE"]."""
    alias = _conf().get("DATABASE", "default")
    if not isinstance(alias, str) or alias not in django_settings.DATABASES:
        raise ImproperlyConfigured(
            f"settings.NOTIFYQ['DATABASE'] is {alias!r}, which is not an alias in DATABASES"
        )
    return alias


def autodiscover() -> bool:
    """Whether the worker imports the ``tasks`` module of every installed app."""
    return bool(_conf().get("AUTODISCOVER", True))


def database_url_of(alias: str) -> str | None:
    """A libpq connection string for Django's database ``alias``, or None when it is not
    PostgreSQL. Made from Django's own connection parameters (NAME, USER, PASSWORD, HOST,
    PORT and the libpq keys of OPTIONS), read now: under the test runner, that is the test
    database."""
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        return None
    params = wrapper.get_connection_params()
    keywords = {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}
    # Django's own entries (cursor_factory, context, prepare_threshold) are no libpq keys.
    libpq = {key: value for key, value in params.items() if key in keywords and value != ""}
    return psycopg.conninfo.make_conninfo(**libpq)


def _conf() -> dict[str, Any]:
    conf = getattr(django_settings, "NOTIFYQ", None) or {}
    if not isinstance(conf, dict):
        raise ImproperlyConfigured(f"settings.NOTIFYQ must be a dict, not {type(conf).__name__}")
    return {str(key).upper(): value for key, value in conf.items()}
