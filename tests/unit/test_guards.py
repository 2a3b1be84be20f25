"""The guards' settings: a token never empty or padded, and only loopback binds go without a
token or an explicit opt-out.

The tests here need no database; those that do are in tests/test_guards.py.
"""

from __future__ import annotations

import pytest

from notifyq import guards
from notifyq.errors import ConfigurationError
from notifyq.settings import Settings

TOKEN = "s3cret-token"


@pytest.mark.parametrize("value", ["", " ", "\t \n"])
def test_an_empty_or_blank_token_is_a_settings_error(value: str) -> None:
    with pytest.raises(ConfigurationError, match="NOTIFYQ_API_TOKEN"):
        Settings.load(api_token=value)


def test_an_empty_token_from_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFYQ_API_TOKEN", "")
    with pytest.raises(ConfigurationError, match="NOTIFYQ_API_TOKEN: is empty"):
        Settings.load()


def test_a_token_is_stripped_of_surrounding_whitespace() -> None:
    token = Settings.load(api_token=f"  {TOKEN}\n").api_token
    assert token is not None and token.get_secret_value() == TOKEN


def test_only_loopback_binds_go_without_a_token_or_an_explicit_opt_out() -> None:
    # (`notifyq serve --host 0.0.0.0` itself is refused in test_cli, without binding.)
    for host in ("127.0.0.1", "127.0.0.5", "::1", "[::1]", "localhost"):
        assert guards.bind_refusal(Settings.load(host=host)) is None, host
    for host in ("0.0.0.0", "::", "192.168.1.5", "example.internal"):
        reason = guards.bind_refusal(Settings.load(host=host))
        assert reason is not None and "NOTIFYQ_API_TOKEN" in reason, host
        assert "NOTIFYQ_ALLOW_UNAUTHENTICATED=true" in reason and "\n" not in reason
        assert guards.bind_refusal(Settings.load(host=host, api_token=TOKEN)) is None
        assert guards.bind_refusal(Settings.load(host=host, allow_unauthenticated=True)) is None
