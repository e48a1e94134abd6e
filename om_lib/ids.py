"""The one grammar of resource, thread and message ids (CONTRACT §2), checked by the engine and the HTTP API alike.

An id is 1–128 characters, each a Unicode letter or digit, `_`, or one of `- . ~ ( ) ' ! * : @ , ; = + & $ < > [ ] {
} | ^`; `.` and `..` alone are not ids. So UUIDs, emails (`first.last+tag@example.com`) and `user:123` are ids, and
`/ ? # %`, whitespace, control and formatting characters never are. An id is in Unicode normalisation form C (NFC)
and holds no default-ignorable code point (zero-width and bidi marks, variation selectors, tag characters) and no
Hangul filler (U+115F, U+1160, U+3164, U+FFA0: letters by category, but drawn as nothing).

Why exactly these characters: an id travels in URL paths (`/threads/{threadId}/...`). API Gateway decodes the path
before routing, so `/`, `?`, `#` and `%` would change which route is called (a thread `a/b` could be created but never
reached again), and `.`/`..` are removed by HTTP clients as dot segments. The rest is what a path segment of the API's
router matches (Powertools: `\\w` plus RFC 3986's unreserved and sub-delimiter characters), so an id that is accepted
is always reachable. Whitespace and invisible characters are refused, and NFC is required rather than applied, because
two ids that look the same must be the same id: an id a client sent is the id it gets back, byte for byte, and a
decomposed `é` (`e` + U+0301) or a Hangul syllable spelt in jamo is refused with a message saying to normalise it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated, Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema

from om_lib.errors import InvalidIdError

MAX_ID_CHARS = 128
# The characters besides Unicode letters, digits and `_` (`\w`) that an id may hold (see the module docstring).
ID_PUNCTUATION = "-.~()'!*:@,;=+&$<>[]{}|^"
# The same, as a pattern valid both in Python and in JSON Schema's ECMA-262 dialect (also with the `u` flag: only
# `-`, `[` and `]` are escaped in the class). In ECMA-262 `\w` is ASCII only: the pattern documents the grammar for
# generated clients a little narrower than the server's Unicode letters.
ID_PATTERN = r"^(?!\.\.?$)[\w\-.~()'!*:@,;=+&$<>\[\]{}|^]{1," + str(MAX_ID_CHARS) + '}$'
_ID = re.compile(ID_PATTERN)
_NAMED = {'/': 'a slash', '?': 'a question mark', '#': 'a hash', '%': 'a percent sign'}
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, stable since Unicode 7): characters a renderer
# draws as nothing. The Hangul fillers among them are letters (Lo), so `\w` alone would take them.
_DEFAULT_IGNORABLE = re.compile(
    '[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164'
    '\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]'
)
_HANGUL_FILLERS = frozenset('\u115f\u1160\u3164\uffa0')
_NOT_NFC = (
    'is not in Unicode normalisation form C (NFC): normalise it first, e.g. '
    "unicodedata.normalize('NFC', id) in Python or id.normalize('NFC') in JavaScript"
)


def id_problem(value: object) -> str | None:
    """What makes `value` not an id (a phrase for an error message), or None when it is one."""
    if not isinstance(value, str):
        return 'is not a string'
    if not value:
        return 'is empty'
    if len(value) > MAX_ID_CHARS:
        return f'is {len(value)} characters long (at most {MAX_ID_CHARS})'
    invisible = _DEFAULT_IGNORABLE.search(value)
    if invisible is not None:
        char = invisible.group()
        kind = 'a Hangul filler' if char in _HANGUL_FILLERS else 'an invisible character'
        return f'contains {kind} (U+{ord(char):04X})'
    nfc = unicodedata.is_normalized('NFC', value)
    if _ID.fullmatch(value):
        return None if nfc else _NOT_NFC
    if not nfc and _ID.fullmatch(unicodedata.normalize('NFC', value)):
        return _NOT_NFC  # a decomposed letter: its combining mark alone is no id character
    if value in ('.', '..'):
        return f'is {value!r}, which URLs treat as a path step'
    for char in value:
        if char in _NAMED:
            return f'contains {_NAMED[char]} ({char!r})'
        if char.isspace():
            return f'contains whitespace ({char!r})'
        if not _ID.fullmatch(char) and char != '.':
            return f'contains {char!r} (U+{ord(char):04X})'
    return 'is not a valid id'  # not reached: every character passed, so the whole value matches


def check_id(name: str, value: str) -> str:
    """`value` when it is an id; else InvalidIdError naming `name` and the problem (nothing is written)."""
    problem = id_problem(value)
    if problem is not None:
        raise InvalidIdError(name, problem)
    return value


class IdGrammar:
    """Pydantic metadata: the annotated string must be an id (validation error type `invalid_id`).

    The OpenAPI document shows the grammar as `minLength`, `maxLength` and `pattern`.
    """

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(_validate, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema.update({'minLength': 1, 'maxLength': MAX_ID_CHARS, 'pattern': ID_PATTERN})
        return json_schema


def _validate(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise PydanticCustomError('invalid_id', 'the id {problem}', {'problem': problem})
    return value


Id = Annotated[str, IdGrammar()]
"""A resource, thread or message id, for pydantic models (the HTTP API's bodies, paths and query strings)."""
