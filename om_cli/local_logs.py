"""Logs of the local stack: every line names the function that wrote it, and a terminal stays readable.

In Lambda each process runs one invocation at a time, so Powertools keeps the invocation's keys (`function_name`,
`function_request_id`, ...) on its shared logger. The local stack runs the four functions in one process, in
threads, so those keys would name whichever function was invoked last. `invocation(context)` marks the current
thread's invocation, and a filter on the functions' logger writes that invocation's keys on each record (record
attributes win over the logger's keys).

`configure(verbose=...)` sets what `om serve` shows: by default one line per API request and the functions' warnings
(their JSON logs at WARNING, no metric blobs, no emulator request lines); `--verbose` brings back the functions'
INFO logs, their metrics and the emulator's own request log.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

# The Powertools service name of the functions' logger (functions/_observability.py).
FUNCTIONS_LOGGER = 'observational-memory'
# The functions' settings for a terminal: their warnings, no metric blobs (Powertools reads these at each log call).
QUIET_FUNCTIONS = {'POWERTOOLS_LOG_LEVEL': 'WARNING', 'POWERTOOLS_METRICS_DISABLED': 'true'}
VERBOSE_FUNCTIONS = {'POWERTOOLS_LOG_LEVEL': 'INFO', 'POWERTOOLS_METRICS_DISABLED': 'false'}

_current = threading.local()
_installed = threading.Lock()


class _InvocationFilter(logging.Filter):
    """Writes the current thread's invocation keys on each record of the functions' logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = getattr(_current, 'context', None)
        if context is not None:
            record.function_name = context.function_name
            record.function_arn = context.invoked_function_arn
            record.function_request_id = context.aws_request_id
        return True


_FILTER = _InvocationFilter()


def install() -> None:
    """Add the filter to the functions' logger (once)."""
    with _installed:
        functions = logging.getLogger(FUNCTIONS_LOGGER)
        if _FILTER not in functions.filters:
            functions.addFilter(_FILTER)


@contextmanager
def invocation(context: Any) -> Iterator[None]:
    """Within the block, this thread's log lines from the functions name `context`'s function and request."""
    install()
    previous = getattr(_current, 'context', None)
    _current.context = context
    try:
        yield
    finally:
        _current.context = previous


def configure(*, verbose: bool, env: MutableMapping[str, str]) -> None:
    """What `om serve` prints: request lines and warnings, or (`verbose`) everything the functions and the emulator
    log. `env` gets the functions' Powertools settings."""
    env.update(VERBOSE_FUNCTIONS if verbose else QUIET_FUNCTIONS)
    requests = logging.getLogger('om_cli.local_stack')
    if not any(getattr(h, 'om_requests', False) for h in requests.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%H:%M:%S'))
        handler.om_requests = True  # type: ignore[attr-defined]
        requests.addHandler(handler)
    requests.setLevel(logging.DEBUG if verbose else logging.INFO)
    requests.propagate = False
    for name in ('werkzeug', 'moto', 'botocore', 'urllib3'):
        logging.getLogger(name).setLevel(logging.INFO if verbose and name == 'werkzeug' else logging.WARNING)
    # The emulator's Step Functions interpreter logs every failed state with its own internals (object reprs); the
    # reflection function says what failed in words (`release`), so only --verbose shows the emulator's account.
    logging.getLogger('moto.stepfunctions').setLevel(logging.WARNING if verbose else logging.CRITICAL)
