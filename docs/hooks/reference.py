"""The reference pages' generated parts, made at build time from the code they describe, so that
they cannot go stale: a page of docs/ holds a marker line, ``<!-- reference: NAME -->``, which
this MkDocs hook (mkdocs.yml, ``hooks:``) replaces with the Markdown of :data:`SECTIONS`\\[NAME]:

- ``settings``: every setting and its environment variable, from the settings models
  (:class:`notifyq.Settings`, :class:`notifyq.contrib.ContribSettings`), with the command-line
  flags that set the same value, read from the parser;
- ``cli``: every command's ``--help``, from the parser of ``notifyq`` (``build_parser``);
- ``http``: every route and model of the API, from the app's OpenAPI schema;
- ``sql``: the public SQL functions and the columns of ``notifyq.jobs``, from ``sql/schema.sql``
  (the schema as the migrations leave it) and the comment above each function's latest
  definition in ``sql/0NN_*.sql``;
- ``migration``: on a page ``upgrading/0NN.md``, the opening comment of ``sql/0NN_*.sql``;
- ``changelog``: ``CHANGELOG.md``, whose links to the site are made relative to the page.

It also adds the screenshots of the dashboard and the bench's plot to the site, from where the
tests that take them write them (``images/``).

Code blocks made here show output, not commands, and carry the marker that tells
tests/test_docs.py so (``<!-- not run: ... -->``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- reference: (?P<name>[a-z]+) -->$", re.M)


#: Pictures of the site that live elsewhere in the repository: where the site has them, and
#: where their tests write them.
IMAGES = {
    "images/dashboard.png": "notifyq/static/dashboard.png",
    "images/dashboard-scheduled.png": "notifyq/static/dashboard-scheduled.png",
    "images/dashboard-cron.png": "notifyq/static/dashboard-cron.png",
    "images/notifyq-bench.png": "benchmarks/notifyq-bench.png",
}


def on_files(files: Any, config: Any) -> Any:
    """MkDocs' hook: the pictures of :data:`IMAGES` join the site's files."""
    from mkdocs.structure.files import File

    for uri, source in IMAGES.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Any = None, **kwargs: Any) -> str:
    """MkDocs' hook: each marker line replaced by its generated section."""
    where = "" if page is None else page.file.src_uri
    return generate(markdown, where)


def generate(markdown: str, where: str) -> str:
    """``markdown`` (the page at ``where``, relative to docs/) with its markers replaced."""

    def section(match: re.Match[str]) -> str:
        name = match["name"]
        if name == "migration":
            return migration_reference(where)
        if name == "changelog":
            return changelog()
        if name not in SECTIONS:
            raise ValueError(f"{where}: no generated reference section is called {name!r}")
        return SECTIONS[name]()

    return MARKER.sub(section, markdown)


def _sql() -> Path:
    """notifyq's SQL files, found as notifyq finds them: this checkout's sql/, installed
    editable."""
    from notifyq.queries import sql_dir

    return sql_dir()


def migration_reference(where: str) -> str:
    """The opening comment of the migration whose number names the page, as a quote."""
    number = Path(where).stem
    found = sorted(_sql().glob(f"{number}_*.sql"))
    if not re.fullmatch(r"\d{3}", number) or len(found) != 1:
        raise ValueError(f"{where}: no migration sql/{number}_*.sql for this page")
    lines = []
    # The comments before the first statement: the migration's own account of itself.
    for line in found[0].read_text().splitlines():
        if line.strip() and not line.startswith("--"):
            break
        lines.append(line.removeprefix("--").removeprefix(" "))
    text = "\n".join(lines).strip()
    return "\n".join(f"> {line}".rstrip() for line in text.splitlines()) + "\n"


def changelog() -> str:
    """CHANGELOG.md without its title, its links into the site made relative to docs/."""
    text = (ROOT / "CHANGELOG.md").read_text()
    body = text.split("\n", 1)[1]
    return body.replace("](docs/", "](")


def _output(language: str, text: str, why: str) -> str:
    return f"<!-- not run: {why} -->\n```{language}\n{text.rstrip()}\n```\n"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# -- settings -------------------------------------------------------------------------------


def settings_reference() -> str:
    """A table per settings model: variable, type, default, meaning, and the flags."""
    from notifyq.contrib import ContribSettings
    from notifyq.settings import Settings

    flags = _flags_by_dest()
    parts = []
    for title, model in (
        ("Every process", Settings),
        (
            "The built-in tasks (`send_email`, `http_request`, `file_digest`, `file_gzip`)",
            ContribSettings,
        ),
    ):
        parts.append(f"### {title}\n")
        parts.append("| variable | type | default | meaning | flag |")
        parts.append("| --- | --- | --- | --- | --- |")
        for name, field in model.model_fields.items():
            variable = _variable(name, field)
            default = _default(field)
            flag = ", ".join(f"`{f}`" for f in sorted(flags.get(name, ())))
            parts.append(
                f"| `{variable}` | {_cell(_type(field.annotation))} | {_cell(default)} | "
                f"{_cell(field.description or '')} | {flag} |"
            )
        parts.append("")
    return "\n".join(parts) + "\n"


def _variable(name: str, field: Any) -> str:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return str(choices[0])
    return f"NOTIFYQ_{name.upper()}"


def _default(field: Any) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)) and not value:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin in (typing.Union, types.UnionType):
        names = [_type(a) for a in args if a is not type(None)]
        optional = type(None) in args
        return " or ".join(names) + (", or unset" if optional else "")
    if origin is typing.Literal:
        return " / ".join(f"`{a}`" for a in args)
    if origin in (list, tuple):
        return "comma-separated list"
    if isinstance(annotation, type):
        return {
            "str": "text",
            "int": "whole number",
            "float": "number",
            "bool": "`true` / `false`",
            "Path": "path",
            "SecretStr": "text (secret)",
        }.get(annotation.__name__, annotation.__name__)
    return str(annotation)


def _flags_by_dest() -> dict[str, set[str]]:
    from notifyq.cli._parser import build_parser

    flags: dict[str, set[str]] = {}
    for _, command in _commands(build_parser()):
        for action in command._actions:
            for option in action.option_strings:
                if option.startswith("--") and option not in ("--help", "--version"):
                    flags.setdefault(action.dest, set()).add(option)
    return flags


# -- the command line -------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield "notifyq", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                yield f"notifyq {name}", command


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    # argparse wraps its help to the terminal's width, which it reads from COLUMNS.
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    """Each command's ``--help``, as the parser prints it."""
    from notifyq.cli._parser import build_parser

    parts = []
    with _columns(100):
        for name, command in _commands(build_parser()):
            command.prog = name
            if name == "notifyq bench":
                text = (
                    "usage: notifyq bench [options]\n\n"
                    "The bench is a distribution of its own (notifyq-bench, in benchmarks/): "
                    "with it installed, notifyq bench --help lists its options."
                )
            else:
                text = command.format_help()
            parts.append(f"### `{name}`\n")
            parts.append(_output("text", text, f"output of {name} --help"))
    return "\n".join(parts)


# -- the HTTP API ---------------------------------------------------------------------------


def _openapi() -> dict[str, Any]:
    from notifyq.api import create_app
    from notifyq.settings import Settings

    # The app is only built, never started: nothing connects to this URL.
    settings = Settings(database_url="postgresql://docs@localhost/docs", run_worker=False)
    schema: dict[str, Any] = create_app(settings).openapi()
    return schema


def _schema_type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_schema_type(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "array":
        return f"list of {_schema_type(schema.get('items', {}))}"
    if kind == "null":
        return "null"
    if "enum" in schema:
        return " / ".join(f"`{v}`" for v in schema["enum"])
    return str(kind or schema.get("format") or "any")


def http_reference() -> str:
    """Every route (method, path, summary, parameters, body, answers), then every model."""
    schema = _openapi()
    parts = ["### Routes\n"]
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            parts.append(f"#### `{method.upper()} {path}`\n")
            text = operation.get("description") or operation.get("summary") or ""
            if text:
                parts.append(text.strip() + "\n")
            parameters = operation.get("parameters", [])
            if parameters:
                parts.append("| parameter | in | type | required | meaning |")
                parts.append("| --- | --- | --- | --- | --- |")
                for p in parameters:
                    meaning = p.get("description") or p.get("schema", {}).get("description", "")
                    parts.append(
                        f"| `{p['name']}` | {p['in']} | {_cell(_schema_type(p.get('schema', {})))}"
                        f" | {'yes' if p.get('required') else 'no'} | {_cell(meaning)} |"
                    )
                parts.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                parts.append(f"Body ({media}): {_schema_type(content.get('schema', {}))}\n")
            answers = operation.get("responses", {})
            if answers:
                parts.append("| answer | meaning |")
                parts.append("| --- | --- |")
                for code, answer in answers.items():
                    parts.append(f"| {code} | {_cell(answer.get('description', ''))} |")
                parts.append("")
    parts.append("### Models\n")
    for name, model in schema.get("components", {}).get("schemas", {}).items():
        parts.append(f"#### {name}\n")
        if model.get("description"):
            parts.append(model["description"].strip() + "\n")
        properties = model.get("properties", {})
        if properties:
            required = set(model.get("required", []))
            parts.append("| field | type | required | meaning |")
            parts.append("| --- | --- | --- | --- |")
            for field, spec in properties.items():
                meaning = _cell(spec.get("description", ""))
                parts.append(
                    f"| `{field}` | {_cell(_schema_type(spec))} | "
                    f"{'yes' if field in required else 'no'} | {meaning} |"
                )
            parts.append("")
    return "\n".join(parts) + "\n"


def openapi_json() -> str:
    """The OpenAPI schema itself, for tools."""
    return json.dumps(_openapi(), indent=2)


# -- SQL ------------------------------------------------------------------------------------


_FUNCTION = re.compile(
    r"^CREATE FUNCTION notifyq\.(?P<name>[a-z_0-9]+)\((?P<args>.*?)\) RETURNS (?P<returns>\S+)",
    re.M,
)


def _split_arguments(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def _comment_above(name: str) -> str:
    """The comment lines right above the latest migration's definition of the function."""
    found = ""
    pattern = re.compile(rf"^CREATE (?:OR REPLACE )?FUNCTION notifyq\.{name}\(", re.M)
    for migration in sorted(_sql().glob("0*.sql")):
        text = migration.read_text()
        for match in pattern.finditer(text):
            lines = text[: match.start()].splitlines()
            comment: list[str] = []
            for line in reversed(lines):
                if line.startswith("--"):
                    comment.insert(0, line.removeprefix("--").strip())
                elif line.startswith("DROP FUNCTION"):
                    continue
                else:
                    break
            if comment:
                found = " ".join(comment)
    return found


def sql_reference() -> str:
    """The functions a psql user calls (those without a ``_vN`` suffix, which are the workers'
    and clients' own, and not triggers), and the columns of notifyq.jobs."""
    schema = (_sql() / "schema.sql").read_text()
    parts = []
    for match in _FUNCTION.finditer(schema):
        name = match["name"]
        if re.search(r"_v\d+$", name) or match["returns"] == "trigger":
            continue
        arguments = _split_arguments(match["args"])
        signature = f"notifyq.{name}(\n" + ",\n".join(f"    {a}" for a in arguments)
        signature += f"\n) RETURNS {match['returns']}"
        parts.append(f"### `notifyq.{name}`\n")
        comment = _comment_above(name)
        if comment:
            parts.append(comment + "\n")
        parts.append(_output("sql", signature, "a signature, from sql/schema.sql"))
    table = re.search(r"^CREATE TABLE notifyq\.jobs \((?P<body>.*?)^\)", schema, re.M | re.S)
    if table is None:
        raise ValueError("sql/schema.sql has no CREATE TABLE notifyq.jobs")
    parts.append("### The columns of `notifyq.jobs`\n")
    parts.append("| column | type and default |")
    parts.append("| --- | --- |")
    for line in table["body"].splitlines():
        line = line.strip().rstrip(",")
        if not line or line.startswith("CONSTRAINT"):
            continue
        column, _, rest = line.partition(" ")
        parts.append(f"| `{column}` | `{_cell(rest)}` |")
    return "\n".join(parts) + "\n"


#: The generated sections, by the name their marker gives.
SECTIONS: dict[str, Callable[[], str]] = {
    "settings": settings_reference,
    "cli": cli_reference,
    "http": http_reference,
    "sql": sql_reference,
}
