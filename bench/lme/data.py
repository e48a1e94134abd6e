"""Reading LongMemEval's published files (`longmemeval_s`, `longmemeval_m`, `longmemeval_oracle`).

Each file is a JSON array of questions with `question_id`, `question_type`, `question`, `answer`, `question_date`,
`haystack_session_ids`, `haystack_dates` and `haystack_sessions` (lists of `{role, content, has_answer?}` turns);
dates are written like `2023/05/20 (Sat) 02:21`. A question whose id ends in `_abs` is an abstention question: the
history does not hold the answer, and the right reply says so.

The file is read as a stream (ijson), one question at a time, so `longmemeval_m` (~2.7 GB) fits in memory. Every
question is checked before the run starts; a malformed one is refused with its id (or its position) and what is
wrong, and nothing runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

QUESTION_TYPES = (
    'single-session-user',
    'single-session-assistant',
    'single-session-preference',
    'multi-session',
    'knowledge-update',
    'temporal-reasoning',
)
ABSTENTION = 'abstention'
ROLES = ('user', 'assistant')
_DATE = re.compile(r'^(\d{4})/(\d{1,2})/(\d{1,2})(?: \((\w{3})\))?(?: (\d{1,2}):(\d{2}))?$')
DATE_EXAMPLE = '2023/05/20 (Sat) 02:21'


class DatasetError(ValueError):
    """The file is not in LongMemEval's format; the message names the question and the field."""


@dataclass(frozen=True)
class Turn:
    """One message of a history session."""

    role: str
    content: str
    has_answer: bool = False


@dataclass(frozen=True)
class Session:
    """One history session: its id, its date and its turns."""

    session_id: str
    date: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Question:
    """One evaluation instance."""

    question_id: str
    question_type: str
    question: str
    answer: str
    question_date: datetime
    sessions: tuple[Session, ...]

    @property
    def abstention(self) -> bool:
        """An abstention question (`_abs` in the id): the right answer says the history does not tell."""
        return '_abs' in self.question_id

    @property
    def turn_count(self) -> int:
        """Turns in the whole history."""
        return sum(len(s.turns) for s in self.sessions)

    def in_time_order(self) -> list[Session]:
        """The sessions by date (the oracle file lists them unsorted), the file's order breaking ties."""
        return [s for _, s in sorted(enumerate(self.sessions), key=lambda item: (item[1].date, item[0]))]


def parse_date(value: object, where: str) -> datetime:
    """`2023/05/20 (Sat) 02:21` (the published form; the weekday and the time may be left out) as a UTC time."""
    if not isinstance(value, str):
        raise DatasetError(f'{where} must be a date string like "{DATE_EXAMPLE}", got {type(value).__name__}')
    match = _DATE.match(value.strip())
    if match is None:
        raise DatasetError(f'{where} is {value!r}, not a date like "{DATE_EXAMPLE}"')
    year, month, day, _, hour, minute = match.groups()
    try:
        return datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), tzinfo=UTC)
    except ValueError as exc:
        raise DatasetError(f'{where} is {value!r}: {exc}') from None


def _text(value: object, where: str, *, numbers: bool = False) -> str:
    if isinstance(value, str):
        return value
    # Some published answers are numbers (a count of days); they are graded as their text.
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return str(int(value)) if float(value).is_integer() else str(value)
    raise DatasetError(f'{where} must be a string, got {type(value).__name__}')


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise DatasetError(f'{where} must be a list, got {type(value).__name__}')
    return value


def parse_question(raw: object, position: int) -> Question:
    """One question of the file, checked; DatasetError names the question and what is wrong."""
    if not isinstance(raw, dict):
        raise DatasetError(f'question #{position} must be an object, got {type(raw).__name__}')
    qid = raw.get('question_id')
    if not isinstance(qid, str) or not qid.strip():
        raise DatasetError(f'question #{position} has no question_id (a non-empty string)')
    name = f'question {qid}'
    for field in ('question_type', 'question', 'answer', 'question_date', 'haystack_session_ids', 'haystack_dates'):
        if field not in raw:
            raise DatasetError(f'{name}: {field} is missing')
    if 'haystack_sessions' not in raw:
        raise DatasetError(f'{name}: haystack_sessions is missing')
    qtype = raw['question_type']
    if qtype not in QUESTION_TYPES:
        raise DatasetError(f'{name}: question_type {qtype!r} is not one of {", ".join(QUESTION_TYPES)}')
    ids = _list(raw['haystack_session_ids'], f'{name}: haystack_session_ids')
    dates = _list(raw['haystack_dates'], f'{name}: haystack_dates')
    sessions = _list(raw['haystack_sessions'], f'{name}: haystack_sessions')
    if not len(ids) == len(dates) == len(sessions):
        raise DatasetError(
            f'{name}: haystack_session_ids, haystack_dates and haystack_sessions must have one entry per session '
            f'(got {len(ids)}, {len(dates)} and {len(sessions)})'
        )
    parsed: list[Session] = []
    for index, (sid, date, turns) in enumerate(zip(ids, dates, sessions, strict=True)):
        where = f'{name}: session {index}'
        session_id = _text(sid, f'{name}: haystack_session_ids[{index}]')
        parsed.append(
            Session(
                session_id,
                parse_date(date, f'{name}: haystack_dates[{index}]'),
                tuple(_turn(turn, f'{where}, turn {t}') for t, turn in enumerate(_list(turns, where))),
            )
        )
    return Question(
        question_id=qid,
        question_type=qtype,
        question=_text(raw['question'], f'{name}: question'),
        answer=_text(raw['answer'], f'{name}: answer', numbers=True),
        question_date=parse_date(raw['question_date'], f'{name}: question_date'),
        sessions=tuple(parsed),
    )


def _turn(raw: object, where: str) -> Turn:
    if not isinstance(raw, dict):
        raise DatasetError(f'{where} must be an object {{role, content}}, got {type(raw).__name__}')
    role = raw.get('role')
    if role not in ROLES:
        raise DatasetError(f'{where}: role must be "user" or "assistant", got {role!r}')
    has_answer = raw.get('has_answer', False)
    if not isinstance(has_answer, bool):
        raise DatasetError(f'{where}: has_answer must be true or false, got {has_answer!r}')
    return Turn(str(role), _text(raw.get('content'), f'{where}: content'), has_answer)


def iter_raw(path: Path) -> Iterator[object]:
    """The file's questions as parsed JSON values, one at a time (ijson: the file is never loaded whole)."""
    import ijson

    with path.open('rb') as handle:
        try:
            yield from ijson.items(handle, 'item', use_float=True)
        except ijson.JSONError as exc:
            raise DatasetError(f'{path} is not a JSON array of questions: {exc}') from None


def load_questions(path: Path | str, *, types: Iterable[str] | None = None, limit: int | None = None) -> list[Question]:
    """Every question of the file, checked, in the file's order; then the ones of `types` (question types, or
    `abstention`), then the first `limit` of those.

    Raises:
        DatasetError: the file is missing or not a LongMemEval file; a question is malformed (named); ids repeat;
            `types` names no known type.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            f'{path} does not exist: download longmemeval_s.json (or _m, _oracle) as docs/longmemeval.md describes'
        )
    wanted = _check_types(types)
    questions: list[Question] = []
    seen: set[str] = set()
    for position, raw in enumerate(iter_raw(path)):
        question = parse_question(raw, position)
        if question.question_id in seen:
            raise DatasetError(f'question {question.question_id} appears twice (question ids must be unique)')
        seen.add(question.question_id)
        questions.append(question)
    if not questions:
        raise DatasetError(f'{path} holds no questions (expected a JSON array of LongMemEval questions)')
    chosen = [
        q for q in questions if wanted is None or q.question_type in wanted or (q.abstention and ABSTENTION in wanted)
    ]
    return chosen[:limit] if limit is not None else chosen


def _check_types(types: Iterable[str] | None) -> set[str] | None:
    if types is None:
        return None
    wanted = {t.strip() for t in types if t.strip()}
    unknown = sorted(wanted - {*QUESTION_TYPES, ABSTENTION})
    if unknown:
        raise DatasetError(
            f'unknown question type {", ".join(unknown)}; use {", ".join((*QUESTION_TYPES, ABSTENTION))}'
        )
    return wanted or None


def category_of(question_type: str, question_id: str) -> list[str]:
    """The report's categories of a question: its type, and `abstention` too for an `_abs` question."""
    return [question_type, ABSTENTION] if '_abs' in question_id else [question_type]


def type_counts(questions: Sequence[Question]) -> dict[str, int]:
    """Questions per type (and abstention), in the report's order."""
    counts = dict.fromkeys((*QUESTION_TYPES, ABSTENTION), 0)
    for q in questions:
        for category in category_of(q.question_type, q.question_id):
            counts[category] += 1
    return {k: v for k, v in counts.items() if v}
