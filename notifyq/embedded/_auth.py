"""Who may log in: the hba file given to every start (trust on the private unix socket, a
password on 127.0.0.1, nothing else), the superuser's password kept for a server on TCP, and the
check that a running server was started with those rules."""

from __future__ import annotations

import os
import re
import secrets

import psycopg

from notifyq.embedded._layout import Paths, write_file
from notifyq.embedded._postmaster import HOST, Postmaster

# What secrets.token_urlsafe makes: safe in a URL and in a SQL literal as it is.
PASSWORD_RE = re.compile(r"[A-Za-z0-9_-]{32,}")


def hba_rules(*, tcp: bool) -> str:
    """The client authentication rules: trust on the unix socket (in a folder only the server's
    account and root can enter), a password on 127.0.0.1, nothing else."""
    lines = [
        "# Written by notifyq at each start of its embedded PostgreSQL (given as hba_file).",
        "# No login over the network without a password.",
    ]
    if tcp:
        lines.append(f"host all all {HOST}/32 scram-sha-256")
    else:
        lines.append("local all all trust")
    lines.append("host all all all reject")
    return "\n".join(lines) + "\n"


def read_password(paths: Paths) -> str | None:
    """The superuser's password kept for a server on TCP, or None if there is none (or it is not
    one that notifyq made)."""
    try:
        fd = os.open(paths.password, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as file:
        text = file.read(1024).strip()
    return text if PASSWORD_RE.fullmatch(text) else None


def new_password(paths: Paths) -> str:
    """A new password for the superuser, kept where only this account (and root) can read it:
    the processes that join the server read it to log in; the server itself keeps a hash."""
    password = secrets.token_urlsafe(32)
    write_file(paths.password, password + "\n", 0o600)
    return password


def unsafe_reason(postmaster: Postmaster, paths: Paths) -> str | None:
    """Why the running server may let someone in without a password: None when it was started
    with our hba file (as every server this version starts is). Servers of older versions read
    the cluster's own pg_hba.conf, which said trust on 127.0.0.1."""
    url = postmaster.url("postgres", read_password(paths) if postmaster.tcp else None)
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT current_setting('hba_file')").fetchone()
    except psycopg.Error as exc:
        return f"cannot be checked ({str(exc).strip()})"
    if row is not None and row[0] == str(paths.hba):
        return None
    return (
        f"was started by an older notifyq, without the rules that ask for a password on "
        f"{postmaster.where}"
    )
