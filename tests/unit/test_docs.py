"""The documentation site (mkdocs.yml, docs/) and the README, read without building or running
anything: every code block run by a test or marked as not run (see tests/docs.py), every page
in the nav, the generated reference complete, every schema version with its upgrade page.

The tests here need no database; those that do are in tests/test_docs.py.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
from types import ModuleType

import pytest

from notifyq.queries import sql_dir
from tests.docs import DOCS, README, blocks, blocks_of, doc_block
from tests.helpers import ROOT

MKDOCS_YML = ROOT / "mkdocs.yml"


def reference_hook() -> ModuleType:
    """docs/hooks/reference.py, the MkDocs hook that generates the reference's sections."""
    spec = importlib.util.spec_from_file_location(
        "notifyq_docs_reference", DOCS / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _test_exists(marker: str) -> str | None:
    """None when the test a ``run:`` marker names exists, else why not."""
    target = marker.removeprefix("run:").strip()
    path, _, name = target.partition("::")
    file = ROOT / path
    if not name or not file.is_file():
        return f"{target!r} names no test file and test (tests/test_x.py::test_name)"
    tree = ast.parse(file.read_text())
    tests = (ast.FunctionDef, ast.AsyncFunctionDef)
    names = {node.name for node in ast.walk(tree) if isinstance(node, tests)}
    return None if name in names else f"{path} has no test {name}"


def test_every_code_block_is_run_by_a_test_or_marked_as_not_run() -> None:
    problems = []
    for block in blocks():
        if block.marker.startswith("run:"):
            why = _test_exists(block.marker)
            if why:
                problems.append(f"{block.where}: {why}")
        elif block.marker.startswith("not run:"):
            if len(block.marker.removeprefix("not run:").strip()) < 10:
                problems.append(f"{block.where}: a 'not run' marker must say why")
        elif block.lang != "sql":
            problems.append(
                f"{block.where}: a {block.lang or 'plain'} block that no test runs: run it in a "
                "test and mark it <!-- run: tests/test_x.py::test_name -->, or mark it "
                "<!-- not run: why --> if it is output or cannot run here"
            )
    assert not problems, "\n".join(problems)


def test_the_generated_reference_marks_its_blocks_as_output() -> None:
    hook = reference_hook()
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        if "<!-- reference: " not in text:
            continue
        generated = hook.generate(text, str(page.relative_to(DOCS)))
        assert "<!-- reference: " not in generated, page
        unmarked = [b for b in blocks_of(page, generated) if not b.marker and b.lang != "sql"]
        assert not unmarked, [b.where for b in unmarked]


def test_every_page_of_the_site_is_in_its_nav() -> None:
    nav = MKDOCS_YML.read_text()
    listed = set(re.findall(r"([\w/-]+\.md)$", nav, re.M))
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert on_disk == listed, {"not in the nav": on_disk - listed, "missing": listed - on_disk}


def test_every_schema_version_has_its_upgrade_page() -> None:
    nav = MKDOCS_YML.read_text()
    missing = []
    for migration in sorted(sql_dir().glob("0*.sql")):
        number = migration.name[:3]
        page = DOCS / "upgrading" / f"{number}.md"
        if not page.is_file() or f"upgrading/{number}.md" not in nav:
            missing.append(
                f"{migration.name}: add docs/upgrading/{number}.md (as 019.md is made), list it "
                "in mkdocs.yml's nav and in docs/upgrading/index.md, and its entry in CHANGELOG.md"
            )
    assert not missing, "\n".join(missing)


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_the_changelog_has_every_schema_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    for migration in sorted(sql_dir().glob("0*.sql")):
        number = int(migration.name[:3])
        if number >= 20:
            continue  # the storage rewrite's: listed under [Unreleased] as they land
        assert f"### Schema version {number}:" in changelog, migration.name


def test_the_settings_reference_names_every_variable() -> None:
    from notifyq.contrib import ContribSettings
    from notifyq.settings import Settings

    text = reference_hook().settings_reference()
    for name in [*Settings.model_fields, *ContribSettings.model_fields]:
        variable = {"database_url": "DATABASE_URL", "imports": "NOTIFYQ_IMPORT"}.get(
            name, f"NOTIFYQ_{name.upper()}"
        )
        assert f"| `{variable}` |" in text, variable
    assert "`--concurrency`" in text


def test_the_cli_reference_has_every_command() -> None:
    from notifyq.cli._parser import build_parser

    text = reference_hook().cli_reference()
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name in commands.choices:
        assert f"### `notifyq {name}`" in text, name
    assert "usage: notifyq worker" in text


def test_the_http_reference_has_every_route() -> None:
    hook = reference_hook()
    text = hook.http_reference()
    for path, methods in json.loads(hook.openapi_json())["paths"].items():
        for method in methods:
            assert f"#### `{method.upper()} {path}`" in text, (method, path)


def test_the_sql_reference_has_the_public_functions_and_every_column() -> None:
    text = reference_hook().sql_reference()
    assert "### `notifyq.enqueue`" in text
    assert "claim_v4" not in text, "the workers' own functions are not listed"
    for column in ("id", "task", "payload", "status", "depends_on", "trace_context", "ref"):
        assert f"| `{column}` |" in text, column


@pytest.mark.parametrize("name", ["tasks.py", "views.py"])
def test_the_django_task_files_are_the_tested_ones(name: str) -> None:
    block = doc_block(f"# newsletter/{name}\n")
    tested = ROOT / "tests" / "django_project" / "newsletter" / name
    assert block.split("\n", 1)[1] == tested.read_text()


def test_the_sites_first_screen_is_the_readmes() -> None:
    # tests/test_first_screen.py runs the README's commands and checks its output block; the
    # site's copies must say the same.
    commands, output = blocks_of(README)[:2]
    assert output.lang == "text", "the README's output of notifyq dev comes second"
    for page in (DOCS / "getting-started.md", DOCS / "index.md"):
        assert blocks_of(page)[0].code == commands.code, page
    (shown,) = [b for b in blocks_of(DOCS / "getting-started.md") if b.lang == "text"]
    assert shown.code == output.code


def test_blocks_that_tests_find_by_their_first_line_are_the_same_wherever_shown() -> None:
    # Tests find a block by its first line, the README's first: a copy on another page with
    # the same first line must be the same block, or the copy is not the one they run.
    by_first_line: dict[str, set[str]] = {}
    for block in blocks():
        if block.marker.startswith("run:"):
            by_first_line.setdefault(block.first_line, set()).add(block.code)
    differing = [line for line, codes in by_first_line.items() if len(codes) > 1]
    assert not differing, differing
