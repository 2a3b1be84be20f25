"""docker-compose.yml read as compose reads it: a token required, published on loopback only.

The tests here need no database; those that do are in tests/test_compose.py.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from notifyq.settings import Settings
from tests.helpers import ROOT

COMPOSE = ROOT / "docker-compose.yml"
#: The secrets compose reads from .env, besides the token.
PASSWORDS = {"POSTGRES_PASSWORD": "owner-pw", "NOTIFYQ_WORKER_PASSWORD": "worker-pw"}
#: The role the API and the workers connect as (made by the setup service).
WORKER_ROLE = "notifyq_worker"


class ComposeError(Exception):
    """What ``docker compose`` would print and stop with."""


# $$, ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message},
# ${NAME:+other}, ${NAME+other} and $NAME, as compose's interpolation reads them.
_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<name>\w+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}|(?P<bare>\w+))"
)


def interpolate(value: str, env: dict[str, str], where: str) -> str:
    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg = match.group("op") or "", match.group("arg") or ""
        is_set = name in env
        has_value = bool(env.get(name))
        present = has_value if op.startswith(":") else is_set
        if op.endswith("?") and not present:
            raise ComposeError(
                f"error while interpolating {where}: required variable {name} is missing a "
                f"value: {arg}"
            )
        if op.endswith("-"):
            return env[name] if present else arg
        if op.endswith("+"):
            return arg if present else ""
        return env.get(name, "")

    return _VARIABLE.sub(substitute, value)


def _interpolated(node: Any, env: dict[str, str], where: str) -> Any:
    if isinstance(node, str):
        return interpolate(node, env, where)
    if isinstance(node, dict):
        return {
            k: _interpolated(v, env, f"{where}.{k}" if where else str(k)) for k, v in node.items()
        }
    if isinstance(node, list):
        return [_interpolated(v, env, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def load_compose(env: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml as compose sees it with ``env`` (the shell's variables over .env's):
    YAML merge keys resolved (PyYAML's safe loader does ``<<:`` as YAML 1.1 says, which is what
    compose follows), ``x-`` extension fields dropped, values interpolated."""
    document = yaml.safe_load(COMPOSE.read_text())
    document = {k: v for k, v in document.items() if not k.startswith("x-")}
    interpolated: dict[str, Any] = _interpolated(document, env, "")
    for service in interpolated["services"].values():
        environment = service.get("environment", {})
        if isinstance(environment, list):  # the KEY=value list form
            environment = dict(item.split("=", 1) for item in environment)
        service["environment"] = {k: "" if v is None else str(v) for k, v in environment.items()}
    return interpolated


def seconds(duration: str) -> float:
    """A compose duration (``30s``, ``1m30s``, ``500ms``) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_compose_requires_a_token_and_publishes_on_loopback_only() -> None:
    with pytest.raises(ComposeError) as missing:
        load_compose(dict(PASSWORDS))
    message = str(missing.value)
    assert "required variable NOTIFYQ_API_TOKEN is missing a value" in message
    assert ".env next to docker-compose.yml" in message  # it says how to set one
    with pytest.raises(ComposeError):
        load_compose({"NOTIFYQ_API_TOKEN": "", **PASSWORDS})  # :? refuses an empty value too

    for secret in PASSWORDS:  # each role's password is required too, and said where to put
        missing_one = {"NOTIFYQ_API_TOKEN": "t0ken", **PASSWORDS, secret: ""}
        with pytest.raises(ComposeError, match=f"{secret} is missing a value") as missing:
            load_compose(missing_one)
        assert ".env next to docker-compose.yml" in str(missing.value)

    services = load_compose({"NOTIFYQ_API_TOKEN": "t0ken", **PASSWORDS})["services"]
    assert set(services) == {"db", "setup", "api", "worker"}
    published = [port for service in services.values() for port in service.get("ports", [])]
    assert published == ["127.0.0.1:8000:8000"]
    api, worker, setup = services["api"], services["worker"], services["setup"]
    # The api's own environment block merges the shared one rather than replacing it.
    assert api["environment"]["NOTIFYQ_API_TOKEN"] == "t0ken"
    assert api["environment"]["DATABASE_URL"] == worker["environment"]["DATABASE_URL"]
    assert "NOTIFYQ_API_TOKEN" not in worker["environment"]
    assert worker["deploy"]["replicas"] == 2
    # Only the one-shot setup connects as the superuser; the API and the workers as the role
    # it grants a worker's privileges, with a password of its own.
    owner = urlsplit(setup["environment"]["DATABASE_URL"])
    assert (owner.username, owner.password) == ("notifyq", "owner-pw")
    assert setup["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert f"notifyq grant {WORKER_ROLE} --as worker" in setup["command"][2]
    assert setup["restart"] == "no"
    for service in (api, worker):
        url = urlsplit(service["environment"]["DATABASE_URL"])
        assert (url.username, url.password) == (WORKER_ROLE, "worker-pw")
        assert service["environment"]["NOTIFYQ_AUTO_MIGRATE"] == "false"
        assert service["depends_on"] == {"setup": {"condition": "service_completed_successfully"}}
        # Workers drain within NOTIFYQ_SHUTDOWN_GRACE before Docker's SIGKILL, as the
        # comment says, only if the grace is shorter than the stop grace period.
        grace = float(service["environment"].get("NOTIFYQ_SHUTDOWN_GRACE", 25))
        assert grace == Settings.model_fields["shutdown_grace"].default == 25
        assert grace < seconds(service["stop_grace_period"])
