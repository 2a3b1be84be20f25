"""The notifyq command's grammar, read without running it: every command's flags land in its
typed arguments, and passwords are kept out of every line.

The tests here need no database; those that do are in tests/test_cli.py.
"""

from __future__ import annotations

import uuid

#: The least each command takes, for the parsing test below.
MINIMAL_ARGS = {
    "enqueue": ["echo"],
    "status": [str(uuid.UUID(int=1))],
    "wait": [str(uuid.UUID(int=1))],
    "cancel": [str(uuid.UUID(int=1))],
    "queue": ["mail"],
    "grant": ["someone", "--as", "worker"],
    "fair": ["list"],
}


REDACTED = [
    ("postgresql://u:p@ss:w@rd@db.example:5432/x", "postgresql://u:***@db.example:5432/x"),
    ("postgresql://u:p%40ss%3Aw@db.example/x", "postgresql://u:***@db.example/x"),
    (
        "postgres://u:pw@h1:5432,h2:5433/x?sslmode=require",
        "postgres://u:***@h1:5432,h2:5433/x?sslmode=require",
    ),
    (
        "postgresql://db.example/x?user=u&password=pw&sslmode=require",
        "postgresql://db.example/x?user=u&password=***&sslmode=require",
    ),
    ("host=db.example password=pw dbname=x", "host=db.example password=*** dbname=x"),
    ("host=db.example password = pw", "host=db.example password = ***"),
    ("host=db.example password='a b' dbname=x", "host=db.example password=*** dbname=x"),
    ("password='it\\'s a \\\\ b' host=db.example", "password=*** host=db.example"),
    ("host=db.example PASSWORD=pw", "host=db.example PASSWORD=***"),
    # Nothing to hide:
    ("postgresql://u@db.example/x", "postgresql://u@db.example/x"),
    ("host=db.example user=u dbname=x", "host=db.example user=u dbname=x"),
    ("postgresql:///x", "postgresql:///x"),
]


def test_every_command_reads_its_flags_into_its_typed_arguments() -> None:
    from notifyq.cli._args import Arguments, WorkerOptions
    from notifyq.cli._main import COMMANDS
    from notifyq.cli._parser import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert set(COMMANDS) == set(subparsers.choices or ()) - {"bench"}
    for name in COMMANDS:
        argv = ["--log-level", "debug", name, *MINIMAL_ARGS.get(name, [])]
        args = COMMANDS[name](parser.parse_args(argv)).arguments
        assert isinstance(args, Arguments) and args.log_level == "DEBUG"
        # Only `notifyq dev` may run without DATABASE_URL (it finds its own database).
        assert args.needs_database_url() == (name != "dev"), name
        assert args.long_running == isinstance(args, WorkerOptions), name
    worker = parser.parse_args(["worker", "--import", "a", "--import", "b,c", "--queues", "q"])
    overrides = COMMANDS["worker"](worker).arguments.settings_overrides()
    assert (overrides["imports"], overrides["queues"]) == ("a,b,c", "q")
    printing = parser.parse_args(["grant", "someone", "--as", "producer", "--print"])
    assert not COMMANDS["grant"](printing).arguments.needs_database_url()


def test_redact_hides_every_form_of_password() -> None:
    from notifyq.db import redact

    assert [redact(dsn) for dsn, _ in REDACTED] == [shown for _, shown in REDACTED]
