"""The servers of the README's and the site's snippets each listen on a port of their own.

The tests here need no database; those that do are in tests/test_readme_snippets.py.
"""

from __future__ import annotations

import re
import shlex
from collections import defaultdict

from tests.docs import blocks

# The port of every server command the README's shell blocks run, when they name none.
DEFAULT_PORT = 8000


SERVER = re.compile(
    r"(?P<server>notifyq (?:dev|serve)|uvicorn \S+|manage\.py runserver)"
    r"(?P<args>[^#\n]*)"
)


def shell_blocks() -> list[str]:
    """The shell blocks of the README and of every page of the site."""
    return [block.code for block in blocks("sh")]


def server_port(server: str, args: str) -> int:
    words = shlex.split(args, comments=True)
    if "--port" in words:
        return int(words[words.index("--port") + 1])
    if server == "manage.py runserver" and words and words[0].isdigit():
        return int(words[0])
    return DEFAULT_PORT


def test_the_readmes_servers_each_listen_on_a_port_of_their_own() -> None:
    # A user follows the README with `notifyq dev` still running on 8000: every other server
    # it starts needs another port, and every curl must reach one of them.
    servers: dict[int, set[str]] = defaultdict(set)
    for block in shell_blocks():
        for line in block.splitlines():
            for match in SERVER.finditer(line.split(" #", 1)[0]):
                servers[server_port(match["server"], match["args"])].add(match["server"])
    assert servers[DEFAULT_PORT] == {"notifyq dev"}, dict(servers)
    shared = {port: names for port, names in servers.items() if len(names) > 1}
    assert not shared, f"servers of the README sharing a port: {shared}"
    for block in shell_blocks():
        for port in re.findall(r"curl .*?http://127\.0\.0\.1:(\d+)/", block):
            assert int(port) in servers, f"a curl to port {port}, where no server listens"
