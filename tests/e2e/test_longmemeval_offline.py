"""The LongMemEval harness end to end: tests/data/longmemeval_mini.json (twelve questions of every type, a few hundred
turns) through the local stack with the offline model in every role and the exact-match judge; then two questions
with each role on its provider (loopback fakes of Gemini and OpenAI) to check usage, cost and the judge's request.

The harness runs as a user runs it (`bench/longmemeval.py run`, its own process and local stack). Small thresholds
make observation and reflection really happen; the offline score is the offline model's, printed as such.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from tests.fakes.fake_gemini import FakeGemini, fake_gemini_env
from tests.fakes.fake_openai import ChatReply, ChatRequest, FakeOpenAI, fake_openai_env

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / 'tests' / 'data' / 'longmemeval_mini.json'
OFFLINE = [
    *('--observer-model', 'offline', '--reflector-model', 'offline', '--actor-model', 'offline'),
    *('--judge', 'exact', '--parallel', '1', '--message-tokens', '400', '--observation-tokens', '500'),
]

pytestmark = pytest.mark.e2e


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own script, with this interpreter
        [sys.executable, str(ROOT / 'bench' / 'longmemeval.py'), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        check=False,
    )


@pytest.fixture(scope='module')
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp('longmemeval')
    return out, harness('run', str(MINI), '--out', str(out), *OFFLINE)


def test_every_question_is_replayed_observed_answered_and_graded(
    run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = run
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / 'results.jsonl').read_text().splitlines()]
    assert len(records) == 12 and all(r['correct'] is not None for r in records), [r.get('error') for r in records]
    for r in records:
        # The whole dated history went through steps and turns, and the service reported no failure
        assert r['replay']['turns'] >= 14 and r['replay']['failures'] == []
        # Memory was built from it: every question observed; the question's turn was answered from it
        assert r['memory']['observationTokens'] > 0
        assert r['hypothesis'].startswith('(offline model)')
        assert set(r['usage']) >= {'observer', 'actor'} and r['usage']['actor']['offline']['calls'] == 1
    # Reflection happened too (the small threshold), and it is counted by role
    assert sum(1 for r in records if r['memory']['generationCount'] >= 1) >= 3
    assert any('reflector' in r['usage'] for r in records)
    # The Actor's memory is dated by the sessions' dates, relative to the question's date, not to today
    cited = [r['hypothesis'] for r in records if 'remember that matches' in r['hypothesis']]
    assert cited and all(', 2023 (' in text and 'ago)' in text for text in cited)
    assert not any('2026' in text for text in cited)


def test_the_report_is_produced_and_says_what_the_offline_score_is(
    run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, done = run
    summary = json.loads((out / 'report.json').read_text())
    assert summary['questions'] == 12 and summary['memory']['observed'] == 12
    assert set(summary['accuracy']['by_type']) == {
        'single-session-user',
        'single-session-assistant',
        'single-session-preference',
        'multi-session',
        'knowledge-update',
        'temporal-reasoning',
        'abstention',
    }
    assert summary['accuracy']['overall'] is not None and summary['cost_usd']['total'] == 0
    assert (out / 'accuracy_by_type.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    markdown = (out / 'report.md').read_text()
    assert 'Not comparable with published figures' in markdown and '84.23%' in markdown
    assert 'NOT COMPARABLE with published figures' in done.stdout
    print(done.stdout)  # the offline score, as what it is


def test_a_rerun_skips_what_is_graded(run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, _ = run
    again = harness('run', str(MINI), '--out', str(out), *OFFLINE)
    assert again.returncode == 0, again.stderr[-2000:]
    assert '12 graded already, 0 to run' in again.stderr
    assert len((out / 'results.jsonl').read_text().splitlines()) == 12
    other = harness('run', str(MINI), '--out', str(out), *OFFLINE[:-1], '900')
    assert other.returncode == 2 and 'holds a run with other settings' in other.stderr


def test_each_role_runs_on_its_own_provider_and_is_priced(gemini: tuple[FakeGemini, object]) -> None:
    # Given the reference's setting: Observer and Reflector on Gemini, the Actor and the judge on OpenAI (both are
    # loopback fakes here, driven by the real google-genai and openai clients)
    server, _ = gemini

    def openai_answers(request: ChatRequest) -> ChatReply:
        if request.last_user_text.endswith('Answer yes or no only.'):
            return replace(ChatReply.text('Yes'), prompt_tokens=300, completion_tokens=1)
        return replace(ChatReply.text('Your dog is a golden retriever.'), prompt_tokens=5000, completion_tokens=9)

    with FakeOpenAI(openai_answers) as openai_server, tempfile.TemporaryDirectory() as out:
        env = {**os.environ, **fake_gemini_env(server), **fake_openai_env(openai_server)}
        done = subprocess.run(  # noqa: S603 - our own script, with this interpreter
            [
                sys.executable,
                str(ROOT / 'bench' / 'longmemeval.py'),
                'run',
                str(MINI),
                '--out',
                out,
                '--limit',
                '2',
                '--parallel',
                '1',
                '--message-tokens',
                '300',
                '--observation-tokens',
                '600',
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        records = [json.loads(line) for line in (Path(out) / 'results.jsonl').read_text().splitlines()]
        requests = openai_server.chat_requests
    assert [r['correct'] for r in records] == [True, True]
    first = records[0]
    assert set(first['usage']['observer']) == {'google/gemini-2.5-flash'}
    assert first['usage']['actor'] == {
        'openai/gpt-4o': {'calls': 1, 'input_tokens': 5000, 'output_tokens': 9, 'cache_read_tokens': 0}
    }
    assert first['usage']['judge']['openai/gpt-4o']['input_tokens'] == 300
    # Priced from bench/prices.json: gpt-4o at $2.50/$10 per million
    assert first['cost_usd']['actor'] == pytest.approx((5000 * 2.5 + 9 * 10) / 1e6)
    assert first['cost_usd']['observer'] > 0
    # The Actor was told the question's date; the judge got LongMemEval's prompt at temperature 0
    actor = next(r for r in requests if 'What breed is my dog?' in r.last_user_text)
    assert "Today's date is Sunday, May 21, 2023 (UTC)." in actor.system_text
    judged = next(r for r in requests if r.last_user_text.endswith('Answer yes or no only.'))
    assert judged.body['temperature'] == 0 and judged.system_texts == []
    assert 'Correct Answer: golden retriever' in judged.last_user_text
