"""The inspector's files: one explanation per failure reason, the same as the docs' "Failure reasons", for every reason
the engine can report; the page loads only its own files."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from functions.api import inspector
from om_lib.parts import FailureReason

OPERATIONS = Path(__file__).resolve().parents[2] / 'docs' / 'operations.md'


def documented_failure_table() -> list[dict[str, str]]:
    section = OPERATIONS.read_text(encoding='utf-8').split('\n## Failure reasons\n', 1)[1].split('\n## ', 1)[0]
    rows = []
    for line in section.splitlines():
        if line.startswith('| `'):
            reason, meaning, next_, you_can = (cell.strip() for cell in line.strip().strip('|').split(' | '))
            rows.append({'reason': reason.strip('`'), 'meaning': meaning, 'next': next_, 'youCan': you_can})
    return rows


def test_the_page_explains_each_failure_reason_as_the_docs_do() -> None:
    assert inspector.failure_reasons() == documented_failure_table()


def test_every_reason_the_engine_reports_has_an_explanation() -> None:
    explained = {row['reason'] for row in inspector.failure_reasons()}
    assert explained == set(typing.get_args(FailureReason))


def test_the_page_loads_only_its_own_files() -> None:
    html = inspector.page().decode()
    loaded = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(loaded) == ['#main', 'data:,', 'inspector/inspector.css', 'inspector/inspector.js']
    own = {name.removeprefix('inspector/') for name in loaded if name.startswith('inspector/')}
    assert own <= set(inspector.ASSETS)
    assert '{{' not in html
    script = inspector.asset('inspector.js')
    assert script is not None
    # Nothing is fetched from elsewhere (the SVG namespace is a name, not a fetch)
    urls = set(re.findall(r'https?://[^\s\'"`]+', script[0].decode()))
    assert urls == {'http://www.w3.org/2000/svg'}
    assert inspector.asset('../_wiring.py') is None and inspector.asset('index.html') is None
