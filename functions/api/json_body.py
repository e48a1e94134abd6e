"""The one place a request body becomes JSON: strict parsing, so what a route sees can always be stored and read back.

The resolver uses `parse` as its body deserializer (handler.py). Python's `json.loads` alone accepts more than JSON
(RFC 8259) and more than we can store: `NaN` and `Infinity` (which then break every later answer that lists them),
`1e400` (read as infinity), escaped lone surrogates (`"\\ud800"`, which no UTF-8 encoder can write back, so the
request failed *after* it had written), nesting deep enough to exhaust the parser's recursion, and an object that
names one key twice (Python keeps the last; another parser in front of us might keep the first, so the two would
read different requests). Each is refused here with 400 `invalid_json`, before any route runs.

The media type and the UTF-8 encoding are checked earlier, by `edge.admit`, on the raw request.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from functions.api.errors import ApiError
from functions.api.limits import MAX_JSON_DEPTH

_SURROGATE = re.compile('[\ud800-\udfff]')
# An integer literal longer than this cannot fit a double (the largest has 309 digits); Python would read it, and
# refuses past 4,300 digits with a ValueError of its own.
_MAX_INT_DIGITS = sys.float_info.max_10_exp + 1


def invalid_json(message: str, *, field: str = '', kind: str = 'json_invalid') -> ApiError:
    """The 400 answer for a body that is not JSON we accept."""
    detail = {'location': 'body', 'field': field, 'type': kind, 'message': message}
    return ApiError(400, 'invalid_json', f'the request body is not valid JSON: {message}', [detail])


def _refuse_constant(name: str) -> Any:
    raise invalid_json(f'{name} is not a JSON number; send null or a finite number', kind='json_constant')


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float('inf'), float('-inf')):
        raise invalid_json(f'the number {text[:40]} is out of range (it overflows a double)', kind='json_overflow')
    return value


def _bounded_int(text: str) -> int:
    digits = len(text) - (text[0] == '-')
    if digits > _MAX_INT_DIGITS:
        raise invalid_json(
            f'an integer of {digits} digits is out of range (it overflows a double)', kind='json_overflow'
        )
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        duplicate = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise invalid_json(
            f'a duplicate key: {_printable(duplicate)!r} appears twice in one object; send each key once',
            kind='json_duplicate_key',
        )
    return obj


def parse(text: str) -> Any:
    """`text` as JSON, or ApiError 400 `invalid_json` naming what is wrong (and where, when it is known).

    `text` is the admitted body: `edge.admit` has undone base64 and refused what is not UTF-8 already.
    """
    try:
        value = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise invalid_json(f'{exc.msg} (line {exc.lineno}, column {exc.colno})') from exc
    except RecursionError as exc:
        raise invalid_json(f'it is nested deeper than {MAX_JSON_DEPTH} levels', kind='json_too_deep') from exc
    _check_structure(value)
    return value


def _check_structure(value: Any) -> None:
    """Nesting within MAX_JSON_DEPTH, and no lone surrogate in any string or key (walked without recursion)."""
    stack: list[tuple[Any, int, str]] = [(value, 1, '')]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            _check_text(node, path)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            message = f'it is nested deeper than {MAX_JSON_DEPTH} levels'
            raise invalid_json(message, field=_printable(path), kind='json_too_deep')
        if isinstance(node, dict):
            for key, item in node.items():
                child = f'{path}.{key}' if path else str(key)
                _check_text(key, child)
                stack.append((item, depth + 1, child))
        else:
            stack.extend((item, depth + 1, f'{path}[{index}]') for index, item in enumerate(node))


def _check_text(text: str, path: str) -> None:
    if not text.isascii() and _SURROGATE.search(text):
        raise invalid_json(
            'a string holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not text',
            field=_printable(path),
            kind='json_surrogate',
        )


def _printable(path: str) -> str:
    # The path may hold the surrogate itself (in a key), and an answer must be UTF-8: escape, and keep it short.
    escaped = path.encode('ascii', 'backslashreplace').decode('ascii')
    return escaped if len(escaped) <= 200 else escaped[:200] + '…'
