"""What the inspector's browser tests share: the system Chromium driven by Playwright, a fake Gemini that observes
what the user said, the checks a user would notice (contrast, width) and where screenshots go.

Playwright's own browser download cannot be reached here, so the tests launch the Debian `chromium` package
(`apt-get install chromium`; `.ci/run` installs it) with `executable_path`. Without any Chromium the tests skip, saying
so (CI sets OM_REQUIRE_CHROMIUM=1: there they fail). Screenshots of every view go to `$OM_TEST_ARTIFACTS/inspector`
(default: pytest's temporary directory, printed); `OM_UPDATE_SCREENSHOTS=1` also rewrites the README's
`docs/inspector.png`.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.fake_gemini import FakeReply, FakeRequest

ROOT = Path(__file__).resolve().parents[2]
DOCS_SCREENSHOT = ROOT / 'docs' / 'inspector.png'
VIEWPORT = {'width': 1280, 'height': 860}
OBSERVER = 'You are the memory of an AI assistant'
REFLECTOR = 'observation reflector'
REFUSE_MARKER = 'ZEBRA'
DATE = 'Mar 3, 2025'


def chromium_path() -> str | None:
    """The system Chromium: `$OM_CHROMIUM`, else `chromium`, `chromium-browser` or `google-chrome` on PATH."""
    configured = os.environ.get('OM_CHROMIUM')
    if configured:
        return configured if Path(configured).exists() else None
    for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope='module')
def browser() -> Iterator[Any]:
    """One headless Chromium per module."""
    executable = chromium_path()
    if executable is None:
        reason = 'no Chromium found: install it with `apt-get install chromium` (or set OM_CHROMIUM to one)'
        if os.environ.get('OM_REQUIRE_CHROMIUM') == '1':  # CI installs it: a missing browser is a failure there
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip('playwright is not installed: pip install -e ".[dev]"')
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=['--no-sandbox'])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page at a laptop's width; any script error fails the test."""
    context = browser.new_context(viewport=VIEWPORT)
    opened = context.new_page()
    opened.set_default_timeout(10_000)
    errors: list[str] = []
    opened.on('pageerror', lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, f'script errors on the page: {errors}'


@pytest.fixture(scope='module')
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get('OM_TEST_ARTIFACTS')
    folder = Path(base) / 'inspector' if base else tmp_path_factory.mktemp('inspector-screenshots')
    folder.mkdir(parents=True, exist_ok=True)
    print(f'inspector screenshots: {folder}')
    return folder


def ready(page: Any, state: str = 'ready') -> None:
    """Wait until the page says it has shown what it loaded (`body[data-state]`)."""
    page.wait_for_selector(f'body[data-state="{state}"]')


# -- the fake models ---------------------------------------------------------------------------------------------------
class SayingModels:
    """The fake Gemini's three roles: the Observer writes one dated line per sentence the user said (questions 🟡), the
    Reflector condenses to the first few, and refuses (prose, so `invalid_reflection`) when the log holds
    REFUSE_MARKER; the Actor says it noted it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = {'observer': 0, 'reflector': 0, 'actor': 0}

    def __call__(self, request: FakeRequest) -> FakeReply:
        system = request.system_text
        role = 'reflector' if REFLECTOR in system else 'observer' if OBSERVER in system else 'actor'
        with self.lock:
            self.calls[role] += 1
        prompt = ''.join(request.user_texts)
        if role == 'observer':
            return FakeReply.text(observe(prompt))
        if role == 'reflector':
            if REFUSE_MARKER in prompt:
                return FakeReply.text("I'm sorry, but I would rather not condense these notes.")
            return FakeReply.text(reflect(prompt))
        return FakeReply.text('Noted.')


_THREAD_INPUT = re.compile(r'<thread id="([^"]+)">\n(.*?)\n</thread>', re.DOTALL)


def observe(prompt: str) -> str:
    new = prompt.split('## New Message History to Observe', 1)[-1]
    sections = _THREAD_INPUT.findall(new)
    if not sections:
        return observe_one(new)
    # Resource scope: one `<thread id>` section per conversation, under the ids the prompt showed
    # (each with its own continuation hints, as the multi-thread Observer writes them)
    body = []
    for shown, transcript in sections:
        one = observe_one(transcript)
        log = one.split('<observations>\n', 1)[1].split('\n</observations>', 1)[0]
        hints = one.split('</observations>\n', 1)[1]
        body.append(f'<thread id="{shown}">\n{log}\n{hints}\n</thread>')
    return '<observations>\n' + '\n'.join(body) + '\n</observations>'


def observe_one(new: str) -> str:
    lines = []
    time = '09:00'
    for line in new.splitlines():
        match = re.match(r'^User(?: \((\d{1,2}:\d{2})\))?: (.*)$', line)
        if not match:
            continue
        time = match[1] or time
        for sentence in re.findall(r'[^.?!]+[.?!]', match[2]):
            mark = '🟡' if sentence.endswith('?') else '🔴'
            lines.append(f'* {mark} ({time}) User said: {sentence.strip()}')
    if not lines:
        lines = [f'* 🟢 ({time}) The assistant acknowledged the conversation.']
    said = lines[0].split('User said: ', 1)[-1]
    return (
        f'<observations>\nDate: {DATE}\n' + '\n'.join(lines) + '\n</observations>\n'
        f'<current-task>\nPrimary: keep track of what the user said ({said[:40]})\n</current-task>\n'
        '<suggested-response>\nAcknowledge and ask what else to remember.\n</suggested-response>'
    )


def reflect(prompt: str) -> str:
    said = re.findall(r'User said: ([^\n]+)', prompt)
    kept = '; '.join(s.rstrip('.') for s in said[:3]) or 'several facts'
    return f'<observations>\nDate: {DATE}\n* 🔴 (09:00) Condensed: {kept}.\n</observations>'


# -- what the page shows, derived from what the API says ------------------------------------------------------------
_TAGS = re.compile(r'(</?thread\b[^>]*>|</?observation-group\b[^>]*>)')


def observation_lines(observations: str) -> list[str]:
    """The Observer's lines of a log, as the page lists them (tags, boundaries and Date headers are structure)."""
    lines = []
    for raw in _TAGS.sub(r'\n\1\n', observations).split('\n'):
        line = raw.rstrip()
        if not line.strip() or _TAGS.fullmatch(line.strip()):
            continue
        if re.fullmatch(r'\s*--- message boundary \(.+\) ---', line) or re.match(r'\s*Date:\s*', line):
            continue
        lines.append(line)
    return lines


# Every visible text's contrast against the background it is drawn on (WCAG 2.1 AA: 4.5:1, 3:1 for large text).
CONTRAST_CHECK = """
() => {
  const rgba = (s) => { const m = s.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(',').map(Number); return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1}; };
  const lum = (c) => { const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b); };
  const background = (el) => { for (let n = el; n && n.nodeType === 1; n = n.parentElement) {
      const c = rgba(getComputedStyle(n).backgroundColor); if (c && c.a > 0.5) return c; }
    return {r: 255, g: 255, b: 255, a: 1}; };
  const bad = []; let checked = 0;
  const all = [...document.querySelectorAll('body *')];
  for (const el of all) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !el.getClientRects().length) continue;
    const style = getComputedStyle(el);
    if (style.visibility === 'hidden' || el.closest('[hidden]') || el.closest('[aria-hidden=true]')) continue;
    const fg = rgba(el instanceof SVGElement ? style.fill : style.color); if (!fg) continue;
    const bg = background(el instanceof SVGElement ? el.ownerSVGElement.parentElement : el);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const size = parseFloat(style.fontSize); const bold = Number(style.fontWeight) >= 700;
    const needed = size >= 24 || (bold && size >= 18.66) ? 3 : 4.5;
    checked += 1;
    const what = `${el.tagName.toLowerCase()}.${el.className} "${el.textContent.trim().slice(0, 30)}"`;
    if (ratio < needed) bad.push(`${what} ${ratio.toFixed(2)}`);
  }
  return {checked, bad};
}
"""


def assert_readable(page: Any) -> None:
    """Text contrast passes WCAG AA and nothing scrolls sideways at a laptop's width."""
    result = page.evaluate(CONTRAST_CHECK)
    assert result['checked'] > 5 and not result['bad'], result['bad']
    width = page.evaluate('() => [document.documentElement.scrollWidth, window.innerWidth]')
    assert width[0] <= width[1], f'the page is wider than the window: {width}'


def screenshot(page: Any, artifacts: Path, name: str, *, docs: bool = False) -> None:
    """Save the page (all of it) as `<artifacts>/<name>.png`; `docs`: also docs/inspector.png (on request)."""
    path = artifacts / f'{name}.png'
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, path
    if docs and os.environ.get('OM_UPDATE_SCREENSHOTS') == '1':
        page.screenshot(path=str(DOCS_SCREENSHOT))
