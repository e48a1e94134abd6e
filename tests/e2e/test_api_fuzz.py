"""Property-based fuzzing of the live HTTP API from its own OpenAPI document (schemathesis over loopback).

The schema is the one the running local stack serves at `GET /openapi.json`; every operation in it gets requests from
two of schemathesis' phases, sent over real HTTP to the module's local stack:

- the coverage phase's negative cases: every parameter and body field of the wrong type, missing, one past each
  boundary (`maxLength`, `maxItems`, `maximum`: the documented limits, and the id grammar's length and pattern),
  unknown properties, and unicode and control characters where the schema expects ids;
- the fuzzing phase, schema-valid (positive) and schema-invalid (negative) requests drawn by Hypothesis.

Every answer must:

- never be a 5xx (CONTRACT §2: a refused request is a 4xx; model trouble after a write is reported inside a 200);
- if it is not a 2xx, be JSON of exactly `{"error": {"code", "message", "details"}}` with a snake_case code;
- conform to the schema where schemathesis can check it: documented status code, content type, headers, a 2xx body
  that matches its response schema, and negative (schema-invalid) requests rejected with a 4xx;
- if it is a 4xx, have written nothing: every table item and every bucket object (with its ETag) is the same after
  the request as before it (the stack runs no background work, so only requests change them).

Tolerated, documented differences between the generated schema and the service (none of them hides a 5xx or a wrong
error shape; see the module's report):

- `positive_data_acceptance` is not run: the request models have cross-field rules JSON Schema cannot express (a
  message needs content or parts, a file part needs `url` or `data`, chat takes exactly one of `message`/`content`)
  and limits checked by the route (an attachment's declared size), so schema-valid bodies may fairly be a 413/422.
- A 404 `not_found` "no route" for a path whose id holds a character the router's path segments do not match (e.g. an
  emoji or a no-break space) is accepted even where the operation documents no 404.
- A 204 has no body, hence no Content-Type, although Powertools documents `application/json` content for it.

Bounded: `MAX_EXAMPLES` per operation and mode in the fuzzing phase, at most `MAX_COVERAGE_CASES` per operation in
the coverage phase; derandomized (the same cases every run), no example database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip('schemathesis', reason='schemathesis is a dev dependency (pip install -e .[dev])')

# After the importorskip: hypothesis and requests come with schemathesis.
import hypothesis  # noqa: E402
import requests  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402
from schemathesis.core.parameters import ParameterLocation  # noqa: E402

from om_cli.local_stack import LocalStack  # noqa: E402
from om_lib.ids import id_problem  # noqa: E402
from tests.e2e.conftest import Storage, running_stack  # noqa: E402

pytestmark = pytest.mark.e2e

# Thresholds out of reach: no observation, reflection or other background work, so only requests write. Working
# memory and retrieval are on, so their routes get past "disabled" to their validation and their writes.
FUZZ_CONFIG: dict[str, Any] = {
    'model': 'default',
    'observation': {'messageTokens': 1_000_000, 'bufferTokens': False},
    'reflection': {'observationTokens': 1_000_000},
    'workingMemory': {'enabled': True},
    'retrieval': True,
}
MAX_EXAMPLES = 15
MAX_COVERAGE_CASES = 60
SNAKE_CASE = re.compile(r'[a-z][a-z0-9]*(?:_[a-z0-9]+)*')
ERROR_KEYS = {'code', 'message', 'details'}

CheckFunction = Callable[[Any, Any, Any], Any]


# ---------------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------------
def _json_body(response: Any) -> Any:
    try:
        return json.loads(response.content or b'null')
    except ValueError:
        return None


def _is_no_route(response: Any) -> bool:
    body = _json_body(response)
    if response.status_code != 404 or not isinstance(body, dict):
        return False
    error = body.get('error') or {}
    return error.get('code') == 'not_found' and str(error.get('message', '')).startswith('no route ')


def status_code_documented(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' `status_code_conformance`, except the router's "no route" 404 for ids it cannot match."""
    if _is_no_route(response):
        return None
    return checks.status_code_conformance(ctx, response, case)  # type: ignore[no-any-return]


def content_type_documented(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' `content_type_conformance`, except a 204 (no body, so no Content-Type)."""
    if response.status_code == 204:
        assert not response.content, f'a 204 with a body: {response.content[:200]!r}'
        return None
    return checks.content_type_conformance(ctx, response, case)  # type: ignore[no-any-return]


def contract_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """CONTRACT §2 "Errors": every non-2xx is JSON of exactly `{"error": {"code", "message", "details"}}`."""
    status = response.status_code
    assert status < 500, f'{status} server error'
    if 200 <= status < 300:
        return None
    content_type = (response.headers.get('content-type') or [''])[0]
    assert 'json' in content_type.lower(), f'{status} with Content-Type {content_type!r}'
    body = _json_body(response)
    assert isinstance(body, dict) and set(body) == {'error'}, f'{status} body is not {{"error": …}}: {body!r}'
    error = body['error']
    assert isinstance(error, dict) and set(error) == ERROR_KEYS, f'{status} error keys {sorted(error)}: {body!r}'
    assert isinstance(error['code'], str) and SNAKE_CASE.fullmatch(error['code']), f'code not snake_case: {body!r}'
    assert isinstance(error['message'], str) and error['message'], f'empty message: {body!r}'
    assert isinstance(error['details'], list), f'details is not a list: {body!r}'
    return None


def negative_data_refused(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' `negative_data_rejection`, also counting a 413 (a list or body over its limit) as a refusal, and
    not counting an id that is one by the server's grammar (see `_negative_only_by_regex_dialect`)."""
    if response.status_code == 413 or _negative_only_by_regex_dialect(case):
        return None
    return checks.negative_data_rejection(ctx, response, case)  # type: ignore[no-any-return]


def _negative_only_by_regex_dialect(case: Any) -> bool:
    """True when a case counts as negative only because of ids the server accepts.

    The id pattern's `\\w` is a Unicode word character to the server (Python's `re`, as `om_lib/ids.py` documents)
    and an ASCII one to schemathesis' validator (ECMA-262), so `P²Ñ` is "negative" there and a valid id here. The case
    is let through only when its body is not negated and its path and query parameters, with every id the server's
    grammar accepts replaced by a plain ASCII one, match the schema: anything else negated still fails the check.
    """
    meta = case.meta
    locations = (ParameterLocation.PATH, ParameterLocation.QUERY, ParameterLocation.HEADER, ParameterLocation.COOKIE)
    negated = [loc for loc in (*locations, ParameterLocation.BODY) if meta is not None and meta.is_negative_at(loc)]
    if not negated or any(loc not in (ParameterLocation.PATH, ParameterLocation.QUERY) for loc in negated):
        return False
    for location in negated:
        values, parameters = case.get_container(location), case.operation.get_parameter_set(location)
        if not isinstance(values, dict) or not parameters:
            return False
        properties = parameters.schema.get('properties', {})
        ascii_ids = {
            name: 'x' if _is_id(name, properties.get(name, {})) and id_problem(value) is None else value
            for name, value in values.items()
        }
        if ascii_ids == values or not parameters.get_strict_validator().is_valid(ascii_ids):
            return False
    return True


def _is_id(name: str, schema: dict[str, Any]) -> bool:
    """An id parameter (`resourceId`, `threadId`, ...): schemathesis rewrites the id pattern, so it is known by name."""
    return name.endswith('Id') and 'pattern' in schema


def _checks() -> list[CheckFunction]:
    return [
        contract_error_shape,
        checks.not_a_server_error,
        status_code_documented,
        content_type_documented,
        checks.response_headers_conformance,
        checks.response_schema_conformance,
        negative_data_refused,
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def stack(gemini) -> Iterator[LocalStack]:
    server, _ = gemini
    with running_stack(server, FUZZ_CONFIG) as running:
        yield running


class StoredChanges:
    """What the stack has stored (every table item and bucket object), compared around every refused request."""

    def __init__(self, stack: LocalStack) -> None:
        self._storage = Storage(stack)
        self.last = self._storage.snapshot()

    def after(self, case: Any, response: Any) -> str | None:
        """What a refused request wrote (a message), or None; the snapshot then becomes the new baseline."""
        now, before = self._storage.snapshot(), self.last
        self.last = now
        if 400 <= response.status_code < 500 and now != before:
            (items_before, objects_before), (items_now, objects_now) = before, now
            changed = sorted(set(items_now) ^ set(items_before)) + sorted(set(objects_now) ^ set(objects_before))
            return (
                f'{case.method} {case.formatted_path} answered {response.status_code} but wrote: '
                f'{str(changed)[:600]}; body {str(case.body)[:300]}'
            )
        return None


@pytest.fixture(scope='module')
def stored(stack) -> StoredChanges:
    return StoredChanges(stack)


@pytest.fixture(scope='module')
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False  # loopback only: no proxy from the environment
        yield session


@pytest.fixture(scope='module')
def api_schema(stack, http) -> Any:
    """The OpenAPI document the running stack serves, loaded by schemathesis."""
    return schemathesis.openapi.from_url(f'{stack.url}/openapi.json', config=schemathesis.Config(), timeout=30)


def _operations(schema: Any) -> list[Any]:
    operations = [result.ok() for result in schema.get_all_operations()]
    assert operations, 'the OpenAPI document has no operations'
    return operations


def _takes_input(operation: Any) -> bool:
    definition = operation.definition.raw
    return bool(definition.get('parameters') or definition.get('requestBody'))


def _call_and_check(case: Any, base_url: str, http: requests.Session, stored: StoredChanges) -> None:
    response = case.call(base_url=base_url, session=http, timeout=30)
    wrote = stored.after(case, response)
    case.validate_response(response, checks=_checks())
    assert wrote is None, wrote


def _fuzz(operation: Any, mode: GenerationMode, base_url: str, http: requests.Session, stored: StoredChanges) -> None:
    fuzz_settings = settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        verbosity=hypothesis.Verbosity.quiet,
    )

    @fuzz_settings
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        _call_and_check(case, base_url, http, stored)

    run()


def _coverage_cases(schema: Any, operation: Any) -> list[Any]:
    """The coverage phase's negative cases of one operation (deterministic), at most MAX_COVERAGE_CASES of them.

    Cut evenly across the list rather than at its head, so every field's boundaries get their turn.
    """
    generation = schema.config.generation_for(operation=operation, phase='coverage')
    cases = list(
        schema.iter_coverage_cases(operation, generation_modes=[GenerationMode.NEGATIVE], generation_config=generation)
    )
    if len(cases) <= MAX_COVERAGE_CASES:
        return cases
    step = len(cases) / MAX_COVERAGE_CASES
    return [cases[int(i * step)] for i in range(MAX_COVERAGE_CASES)]


# ---------------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------------
def test_the_document_lists_the_core_routes(api_schema):
    paths = {operation.path for operation in _operations(api_schema)}
    assert {'/threads/{threadId}/steps', '/threads/{threadId}/messages', '/health'} <= paths


def test_every_operation_refuses_the_coverage_phases_negative_cases(api_schema, stack, http, stored, subtests):
    covered = 0
    for operation in _operations(api_schema):
        cases = _coverage_cases(api_schema, operation)
        with subtests.test(msg=operation.label):
            for case in cases:
                _call_and_check(case, stack.url, http, stored)
        covered += len(cases)
    assert covered > 400  # every operation's fields, each several ways


@pytest.mark.parametrize('mode', [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_every_operation_answers_within_the_contract(api_schema, stack, http, stored, subtests, mode):
    fuzzed = 0
    for operation in _operations(api_schema):
        if mode is GenerationMode.NEGATIVE and not _takes_input(operation):
            continue  # nothing to make invalid
        with subtests.test(msg=operation.label):
            _fuzz(operation, mode, stack.url, http, stored)
        fuzzed += 1
    assert fuzzed
    if mode is GenerationMode.POSITIVE:
        assert stored.last[0], 'accepted requests wrote nothing: the write check would see nothing either'


# Minimal reproductions of what the fuzzer found (kept as plain tests: they name the bug when they fail).
def _assert_contract_answer(response: requests.Response) -> None:
    assert response.status_code < 500, f'{response.status_code}: {response.text}'
    if response.status_code >= 300:
        body = response.json()
        assert set(body) == {'error'} and set(body['error']) == ERROR_KEYS, body


def test_a_body_that_is_not_utf8_is_refused_with_a_400(stack, http):
    """Negative fuzzing: a non-UTF-8 body failed in the framework's body decoding and answered 500."""
    response = http.post(
        f'{stack.url}/threads/fuzz-1/steps', data=b'\xff', headers={'Content-Type': 'application/json'}, timeout=30
    )
    _assert_contract_answer(response)
    assert response.status_code == 400, response.text


def test_chat_with_empty_content_on_a_new_thread_is_not_a_server_error(stack, http):
    """Positive fuzzing: `content: ""` gave the Actor no contents; google-genai raised ValueError, answered 500."""
    response = http.post(f'{stack.url}/threads/fuzz-2/chat', json={'resourceId': 'fuzz', 'content': ''}, timeout=30)
    _assert_contract_answer(response)
