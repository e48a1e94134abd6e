"""One LongMemEval question through the memory service, and a whole run of them (bounded parallelism, resumable).

A question gets a fresh resource. Its history sessions are replayed in time order, each turn with the session's date
(`createdAt`; turns a second apart), as a client would send them: a run of user turns through `POST …/steps`, the
assistant's answers through `POST …/turns`. In resource scope (the default) each session is a thread of the resource
and the question is asked in a new thread; in thread scope the sessions and the question share one thread. When the
background work has settled, the question is sent to `POST …/chat` with `createdAt` = the question's date, which is
"now" for the Actor (the date it is told, and what relative dates in its memory count from). The reply is graded, the
record goes to results.jsonl, and the resource is deleted (unless kept).

Everything goes through the HTTP API with the Python client (om_client): the local stack (in this process) or a
deployed stack are driven the same way.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.lme.data import Question, Session
from bench.lme.judge import Judge
from bench.lme.usage import ModelMeter, cost_of

RESULTS = 'results.jsonl'
RUN_FILE = 'run.json'
# The run settings that must match for a rerun to add to the same results (resuming).
RESUME_KEYS = ('dataset', 'stack', 'scope', 'models', 'judge', 'thresholds', 'config')
_UNSAFE = re.compile(r'[^A-Za-z0-9_.:-]+')


def safe_id(text: str, limit: int = 90) -> str:
    """A piece of an id in the API's id grammar (no `/ ? # %`, whitespace or control characters)."""
    return _UNSAFE.sub('_', text)[:limit] or 'x'


# -- the results file ------------------------------------------------------------------------------------------------
class ResumeError(ValueError):
    """The results directory holds something else; the message says how to go on."""


class ResultsFile:
    """results.jsonl: one JSON record per graded (or failed) question, appended as each finishes.

    A rerun reads it and skips every question with a graded record; a question that failed (`correct` is null) is run
    again, and its newest record wins.
    """

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / RESULTS
        self._lock = threading.Lock()

    def records(self) -> list[dict[str, Any]]:
        """The newest record of each question, in the order they were first written."""
        latest: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return []
        for number, line in enumerate(self.path.read_text(encoding='utf-8').splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                # A run killed mid-write leaves a partial last line; that question simply runs again.
                continue
            if not isinstance(record, dict) or 'question_id' not in record:
                raise ResumeError(f'{self.path}:{number} is not a result record; move the file away to start over')
            latest[str(record['question_id'])] = record
        return list(latest.values())

    def done(self) -> set[str]:
        """Questions graded already (they are skipped)."""
        return {r['question_id'] for r in self.records() if r.get('correct') is not None}

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record (a whole line, flushed at once), on a line of its own even after a killed run's half."""
        line = (json.dumps(record, ensure_ascii=False) + '\n').encode()
        with self._lock, self.path.open('ab+') as handle:
            if handle.seek(0, 2) > 0:
                handle.seek(-1, 2)
                if handle.read(1) != b'\n':
                    line = b'\n' + line
            handle.write(line)
            handle.flush()


def check_resumable(out_dir: Path, run: Mapping[str, Any]) -> None:
    """Refuse to add results of a different configuration to an existing run directory; write run.json."""
    path = out_dir / RUN_FILE
    if path.exists():
        before = json.loads(path.read_text())
        changed = [k for k in RESUME_KEYS if before.get(k) != run.get(k)]
        if changed:
            details = '; '.join(f'{k}: {before.get(k)!r} then, {run.get(k)!r} now' for k in changed)
            raise ResumeError(
                f'{out_dir} holds a run with other settings ({details}). Use another --out directory, or the same '
                'settings to resume it.'
            )
        run = {**run, 'started': before.get('started', run.get('started'))}
    path.write_text(json.dumps(run, indent=2) + '\n')


# -- one question ----------------------------------------------------------------------------------------------------
@dataclass
class Options:
    """How questions are run."""

    scope: str = 'resource'
    keep_resources: bool = False
    settle_timeout_s: float = 300.0
    settle: Callable[[Any, str, str], None] | None = None


@dataclass
class Replay:
    """What the replay sent and what the service reported back."""

    sessions: int = 0
    turns: int = 0
    requests: int = 0
    skipped_turns: int = 0
    failures: list[str] = field(default_factory=list)
    last_thread: str = ''


def _turn_runs(session: Session) -> Iterable[tuple[str, list[tuple[int, Any]]]]:
    """Consecutive turns of one role, with their positions."""
    run: list[tuple[int, Any]] = []
    role = ''
    for index, turn in enumerate(session.turns):
        if turn.role != role and run:
            yield role, run
            run = []
        role = turn.role
        run.append((index, turn))
    if run:
        yield role, run


def replay(client: Any, question: Question, resource: str, scope: str) -> Replay:
    """Send the question's history: each session in time order, turns dated from the session's date."""
    from om_client import Message

    done = Replay()
    for number, session in enumerate(question.in_time_order()):
        thread = f's{number:03d}-{safe_id(session.session_id)}' if scope == 'resource' else 'history'
        done.sessions += 1
        done.last_thread = thread
        for role, run in _turn_runs(session):
            messages = []
            for index, turn in run:
                if not turn.content.strip():
                    done.skipped_turns += 1
                    continue
                messages.append(
                    Message(
                        id=f'm{number:03d}-{index:03d}',
                        role=role,
                        content=turn.content,
                        created_at=session.date + timedelta(seconds=index),
                    )
                )
            for start in range(0, len(messages), 100):  # the API takes 100 messages a request
                batch = messages[start : start + 100]
                if role == 'user':
                    answer = client.step(thread, batch, resource_id=resource)
                else:
                    answer = client.turn(thread, batch, resource_id=resource)
                done.requests += 1
                done.turns += len(batch)
                # A reflection retried at a stronger level is the ladder at work; what failed for good is kept.
                done.failures += [
                    str(p.data.get('error') or p.type) for p in answer.failures if not p.data.get('retrying')
                ]
    return done


def settle_by_polling(client: Any, resource: str, thread: str, *, timeout_s: float, interval_s: float = 2.0) -> None:
    """Wait until the memory stops changing (three equal readings) or `timeout_s` passes: the way to wait for a
    deployed stack's background work, which a client cannot see queued."""
    deadline = time.monotonic() + timeout_s
    previous: tuple[Any, ...] | None = None
    same = 0
    while time.monotonic() < deadline and same < 2:
        status = client.memory(thread, resource_id=resource)
        buffered = status.buffered
        running = buffered is not None and 'running' in (buffered.observations.status, buffered.reflection.status)
        reading = (status.observation_tokens, status.pending_message_tokens, status.generation_count, running)
        same = same + 1 if reading == previous and not running else 0
        previous = reading
        time.sleep(interval_s)


def ask(client: Any, question: Question, resource: str, thread: str) -> tuple[str | None, str | None]:
    """The chat turn, asked on the question's date: (reply text, error)."""
    from om_client import Message

    message = Message(id='question', role='user', content=question.question, created_at=question.question_date)
    answer = client.chat(thread, message, resource_id=resource)
    if answer.reply is None:
        failed = answer.parts_of('data-om-actor-failed')
        return None, f'the Actor failed: {failed[0].data if failed else answer.parts}'
    return answer.reply.text(), None


def run_question(
    client: Any,
    question: Question,
    judge: Judge,
    options: Options,
    *,
    meter: ModelMeter | None,
    prices: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """Replay, settle, ask, grade: the question's result record (with `error` and `correct: null` on failure)."""
    started = time.monotonic()
    resource = f'lme-{safe_id(question.question_id, 60)}-{uuid.uuid4().hex[:8]}'
    thread = 'question' if options.scope == 'resource' else 'history'
    record: dict[str, Any] = {
        'question_id': question.question_id,
        'question_type': question.question_type,
        'abstention': question.abstention,
        'question': question.question,
        'answer': question.answer,
        'question_date': question.question_date.isoformat(),
        'resource_id': resource,
        'correct': None,
    }
    try:
        done = replay(client, question, resource, options.scope)
        record['replay'] = {
            'sessions': done.sessions,
            'turns': done.turns,
            'requests': done.requests,
            'skipped_turns': done.skipped_turns,
            'failures': done.failures[:20],
        }
        settle = options.settle or (lambda c, r, t: settle_by_polling(c, r, t, timeout_s=options.settle_timeout_s))
        if done.last_thread:
            # The question's thread does not exist yet: the resource's memory is read through the last session's.
            settle(client, resource, done.last_thread)
        reply, error = ask(client, question, resource, thread)
        record['hypothesis'] = reply
        settle(client, resource, thread)  # what the question's own turn scheduled belongs to its bill too
        status = client.memory(thread, resource_id=resource)
        record['memory'] = {
            'observationTokens': status.observation_tokens,
            'generationCount': status.generation_count,
            'pendingMessageTokens': status.pending_message_tokens,
        }
        if error is not None:
            record['error'] = error
        else:
            verdict = judge.grade(
                question.question_type, question.question, question.answer, reply or '', abstention=question.abstention
            )
            record['correct'] = verdict.correct
            record['judge'] = {'name': verdict.judge, 'template': verdict.template, 'said': verdict.raw}
            if verdict.usage:
                record['judge_usage'] = verdict.usage
    except Exception as exc:  # noqa: BLE001 - a failed question is recorded and run again next time, not fatal
        record['error'] = f'{type(exc).__name__}: {exc}'
    finally:
        usage: dict[str, Any] = meter.take(resource) if meter is not None else {}
        if record.get('judge_usage'):
            usage['judge'] = record.pop('judge_usage')
        record['usage'] = usage
        record['cost_usd'], record['unpriced_models'] = cost_of(usage, prices)
        record['seconds'] = round(time.monotonic() - started, 1)
        if not options.keep_resources:
            try:
                client.delete_resource(resource)
            except Exception as exc:  # noqa: BLE001 - the result stands; the resource can be deleted later
                record['cleanup_error'] = f'{type(exc).__name__}: {exc}'
    return record


# -- the run ---------------------------------------------------------------------------------------------------------
def run_all(
    questions: Sequence[Question],
    results: ResultsFile,
    work: Callable[[Question], dict[str, Any]],
    *,
    parallel: int,
    progress: Callable[[int], Any] | None = None,
) -> list[dict[str, Any]]:
    """Run every question not graded yet, `parallel` at a time, appending each record as it finishes."""
    done = results.done()
    todo = [q for q in questions if q.question_id not in done]
    bar = progress(len(todo)) if progress is not None else None
    finished: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        pending: set[Future[dict[str, Any]]] = set()
        queue = iter(todo)
        for question in queue:
            pending.add(pool.submit(work, question))
            if len(pending) >= parallel:
                break
        while pending:
            finished_now, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished_now:
                record = future.result()
                results.append(record)
                finished.append(record)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(_postfix(finished))
                nxt = next(queue, None)
                if nxt is not None:
                    pending.add(pool.submit(work, nxt))
    if bar is not None:
        bar.close()
    return finished


def _postfix(records: Sequence[Mapping[str, Any]]) -> str:
    graded = [r for r in records if r.get('correct') is not None]
    errors = len(records) - len(graded)
    right = sum(bool(r['correct']) for r in graded)
    text = f'{right}/{len(graded)} correct' if graded else 'none graded yet'
    return text + (f', {errors} failed' if errors else '')


def now_iso() -> str:
    """The run's start, for the report."""
    return datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')
