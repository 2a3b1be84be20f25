"""``notifyq grant``: least privileges for a database role (see :mod:`notifyq.grants`)."""

from __future__ import annotations

import os

from notifyq.cli._args import GrantArgs
from notifyq.cli._errors import Failed
from notifyq.cli._output import say
from notifyq.grants import grant as run_grants
from notifyq.grants import statements
from notifyq.settings import Settings


def grant(args: GrantArgs, settings: Settings) -> int:
    """Gives ``args.role`` the privileges of its kind, or prints the statements that would."""
    if args.print_only:
        for statement in statements(args.role, args.kind):
            print(f"{statement.as_string(None)};")
        return 0
    password = None
    if args.login_password_env is not None:
        password = os.environ.get(args.login_password_env, "")
        if not password.strip():
            raise Failed(
                f"--login-password-env {args.login_password_env}: that variable is unset or "
                "empty; put the role's password in it"
            )
    run_grants(settings, args.role, args.kind, password=password)
    say(f"notifyq: {args.role} has the privileges of a {args.kind} now")
    return 0
