"""The documentation a user reads: the README starts with the two commands and stays short; no page or help text names
a document the user does not have (the project's internal contract, its seeds, issue numbers, section marks); every
link to a repository file resolves (and its anchor, in a Markdown page); every configuration option and service
setting is in the configuration reference; the API reference is what the served OpenAPI document renders to."""

from __future__ import annotations

import argparse
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / 'README.md'
# Pages written alongside this one that the README and the index already link to; each leaves this list when it lands.
ARRIVING = {'docs/security.md', 'docs/streaming.md', 'docs/observation-log.md', 'docs/longmemeval.md'}
# The developers' own dated record names the issues and the reference's documents on purpose.
NOT_USER_FACING = {'docs/decision_log.md'}

# What a user of this repository does not have: the project's contract and seeds, issue numbers, "§" references.
FOREIGN = [
    (re.compile(r'\bCONTRACT\b'), 'the project contract'),
    (re.compile(r'\bseeds?\s*\d|\bthe seeds?\b|\bseed\'s\b', re.IGNORECASE), 'a seed document'),
    (re.compile(r'§'), 'a section of a document outside the repository'),
    (re.compile(r'\bissues?\s+\d+', re.IGNORECASE), 'an issue number'),
    (re.compile(r'(?<![\w/&])#\d{3,}\b'), 'an issue number'),
    (re.compile(r'/work/'), 'a path on the machine it was written on'),
    (re.compile(r'^\|\s*issue\s*\|', re.IGNORECASE | re.MULTILINE), 'a status table by issue'),
]


def user_pages() -> list[Path]:
    clients = [ROOT / 'clients' / 'python' / 'README.md', ROOT / 'clients' / 'typescript' / 'README.md']
    pages = [README, ROOT / 'CHANGELOG.md', *clients, *sorted(ROOT.glob('docs/*.md'))]
    return [p for p in pages if p.relative_to(ROOT).as_posix() not in NOT_USER_FACING]


def help_texts() -> Iterator[tuple[str, str]]:
    """Every description, epilog and option help of `om` and `om-mcp`, and `om chat`'s command list."""
    from om_cli.main import CHAT_HELP, build_parser

    yield 'om chat /help', CHAT_HELP
    parsers: list[tuple[str, argparse.ArgumentParser]] = [('om', build_parser())]
    while parsers:
        name, parser = parsers.pop()
        yield f'{name} (description)', parser.description or ''
        yield f'{name} (epilog)', parser.epilog or ''
        for action in parser._actions:  # noqa: SLF001 - argparse keeps its actions here
            yield f'{name} {"/".join(action.option_strings) or action.dest}', action.help or ''
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                parsers += [(f'{name} {sub}', subparser) for sub, subparser in action.choices.items()]


def foreign_references(text: str) -> list[str]:
    found = []
    for pattern, what in FOREIGN:
        for match in pattern.finditer(text):
            line = text.count('\n', 0, match.start()) + 1
            found.append(f'line {line}: {match.group(0)!r} ({what})')
    return found


# -- the README -------------------------------------------------------------------------------------------------------
def test_the_readme_starts_with_the_two_commands_and_stays_short() -> None:
    text = README.read_text(encoding='utf-8')
    assert len(text.splitlines()) < 300
    first_block = text.split('```', 2)[1]
    commands = [line.split('#', 1)[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands == ['python3 dev.py demo', 'python3 dev.py test']


# -- documents the user does not have ---------------------------------------------------------------------------------
@pytest.mark.parametrize('page', user_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_names_a_document_outside_the_repository(page: Path) -> None:
    assert foreign_references(page.read_text(encoding='utf-8')) == []


def test_no_help_text_names_a_document_outside_the_repository() -> None:
    found = {where: refs for where, text in help_texts() if (refs := foreign_references(text))}
    assert found == {}


def test_the_check_finds_what_it_is_for() -> None:
    text = 'See CONTRACT §2, seed 003 and issue 15 (#16523).\n| issue | state |'
    assert len(foreign_references(text)) == 6
    assert foreign_references('pre-seeded; [Image #1: a.png]; see docs/api.md#errors; a 409; 1,024 tokens') == []


# -- links ------------------------------------------------------------------------------------------------------------
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
# A repository path in backticks: `om_lib/ids.py`, `bench/cost.py` (placeholders such as `events/<function>/` skipped).
PATH = re.compile(r'`((?:om_lib|om_cli|functions|infra|bench|tests|clients|examples|events|docs|\.ci)/[^`\s]*)`')


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (duplicates get -1, -2, …)."""
    seen: dict[str, int] = {}
    found = set()
    in_code = False
    for line in page.read_text(encoding='utf-8').splitlines():
        if line.startswith('```'):
            in_code = not in_code
        if in_code or not line.startswith('#'):
            continue
        heading = line.lstrip('#').strip().lower()
        slug = re.sub(r'[^\w\- ]', '', heading).replace(' ', '-')
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f'{slug}-{count}')
    return found


def link_problems(page: Path) -> list[str]:
    problems = []
    text = page.read_text(encoding='utf-8')
    for target in LINK.findall(text):
        if re.match(r'[a-z]+:', target):
            continue  # https:, mailto:
        path, _, anchor = target.partition('#')
        resolved = (page.parent / path).resolve() if path else page
        name = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(resolved)
        if name in ARRIVING and not resolved.exists():
            continue
        if not resolved.exists():
            problems.append(f'{target}: no such file')
        elif anchor and resolved.suffix == '.md' and anchor not in anchors(resolved):
            problems.append(f'{target}: no heading with that anchor')
    for path in PATH.findall(text):
        if any(c in path for c in '<>*{}…') or path.startswith('tests/e2e/test_readme'):
            continue
        if not (ROOT / path.split('::')[0].rstrip('/')).exists() and path not in ARRIVING:
            problems.append(f'`{path}`: no such file in the repository')
    return problems


@pytest.mark.parametrize('page', user_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_to_a_repository_file_resolves(page: Path) -> None:
    assert link_problems(page) == []


# -- the configuration reference --------------------------------------------------------------------------------------
def option_paths(schema: dict[str, Any], definitions: dict[str, Any], prefix: str = '') -> Iterator[str]:
    """Every option of the configuration document as a dotted path (`observation.messageTokens`); the forms of a
    model setting and of `messageRange` are documented in prose, not as options."""
    for name, spec in (schema.get('properties') or {}).items():
        path = f'{prefix}{name}'
        yield path
        for option in [spec, *spec.get('anyOf', [])]:
            ref = option.get('$ref', '').rsplit('/', 1)[-1]
            if ref and ref not in {'ModelTiers', 'ModelFallbackEntry', 'MessageRange'}:
                yield from option_paths(definitions[ref], definitions, f'{path}.')


def test_every_option_and_setting_is_in_the_configuration_reference() -> None:
    from functions._wiring import ServiceSettings
    from om_lib.config import OMConfig

    page = (ROOT / 'docs' / 'configuration.md').read_text(encoding='utf-8')
    schema = OMConfig.model_json_schema(by_alias=True)
    # An option is documented by its own row, or (an object of options) by its options' rows
    missing = [p for p in option_paths(schema, schema['$defs']) if f'`{p}`' not in page and f'`{p}.' not in page]
    assert missing == []
    assert all(f'`{form}`' in page or f'"{form}"' in page for form in ('upTo', 'maxRetries', 'before'))
    assert [name for name in ServiceSettings.model_fields if f'`{name}`' not in page] == []
    assert '30 minutes' in page and '5 minutes' in page and '--sweep-interval' in page  # the sweeper


# -- the API reference ------------------------------------------------------------------------------------------------
def test_the_api_reference_is_what_the_served_openapi_document_renders_to() -> None:
    spec = importlib.util.spec_from_file_location('render_api_reference', ROOT / 'docs' / 'render_api_reference.py')
    assert spec is not None and spec.loader is not None
    renderer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(renderer)
    page = (ROOT / 'docs' / 'api-reference.md').read_text(encoding='utf-8')
    assert page == renderer.render(), 'out of date: run .venv/bin/python docs/render_api_reference.py'
    # Every route the API serves is on the page
    document = renderer.openapi()
    for path, operations in document['paths'].items():
        for method in operations:
            assert f'### `{method.upper()} {path}`' in page
