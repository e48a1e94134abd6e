"""A Lambda runtime for the API handler that streams its answers (the chat stream) to API Gateway as they are made.

Python's managed runtime sends a function's result whole; API Gateway's response streaming (`responseTransferMode:
STREAM`, invoked through InvokeWithResponseStream) needs the function to stream. This module is the runtime loop that
does, speaking the documented Lambda Runtime API (`/2018-06-01/runtime/...`) from the managed runtime's interpreter
(started by `stream_bootstrap`, the function's AWS_LAMBDA_EXEC_WRAPPER):

- `GET invocation/next` → the API Gateway proxy event, handed to the very handler the buffered API function runs
  (`_HANDLER`, `functions.api.handler.lambda_handler`), within `streaming.accepting_streams()`;
- `POST invocation/{id}/response` with `Lambda-Runtime-Function-Response-Mode: streaming`, chunked, content type
  `application/vnd.awslambda.http-integration-response`: a JSON prelude (`statusCode`, `headers`, `cookies`), eight
  NUL bytes, then the body — a streamed answer frame by frame as the chat turn makes them, any other answer whole;
- a failure after the prelude went out is reported in the trailers `Lambda-Runtime-Function-Error-Type` and
  `Lambda-Runtime-Function-Error-Body`; a handler that raises is reported to `invocation/{id}/error`.

The invocation ends only when the chat turn has finished and been saved, whether or not the client still listens.
"""

from __future__ import annotations

import base64
import http.client
import importlib
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

logger = logging.getLogger(__name__)

RUNTIME_PATH = '/2018-06-01/runtime'
INTEGRATION_RESPONSE = 'application/vnd.awslambda.http-integration-response'
PRELUDE_DELIMITER = b'\x00' * 8
_TRAILERS = 'Lambda-Runtime-Function-Error-Type, Lambda-Runtime-Function-Error-Body'


class InvocationContext:
    """The Lambda context object, from the Runtime API's headers (what Powertools and our handlers read)."""

    def __init__(self, request_id: str, deadline_ms: int, function_arn: str) -> None:
        self.aws_request_id = request_id
        self.invoked_function_arn = function_arn
        self.function_name = os.environ.get('AWS_LAMBDA_FUNCTION_NAME', '')
        self.function_version = os.environ.get('AWS_LAMBDA_FUNCTION_VERSION', '$LATEST')
        self.memory_limit_in_mb = int(os.environ.get('AWS_LAMBDA_FUNCTION_MEMORY_SIZE', '0') or 0)
        self.log_group_name = os.environ.get('AWS_LAMBDA_LOG_GROUP_NAME', '')
        self.log_stream_name = os.environ.get('AWS_LAMBDA_LOG_STREAM_NAME', '')
        self._deadline_ms = deadline_ms

    def get_remaining_time_in_millis(self) -> int:
        """Milliseconds left before the invocation's timeout."""
        return max(0, self._deadline_ms - int(time.time() * 1000))


Handler = Callable[[dict[str, Any], Any], dict[str, Any]]


def load_handler(name: str) -> Handler:
    """`module.function` (the function's `_HANDLER`)."""
    module_name, _, attribute = name.rpartition('.')
    handler: Handler = getattr(importlib.import_module(module_name), attribute)
    return handler


class RuntimeApi:
    """The Lambda Runtime API at `address` (`AWS_LAMBDA_RUNTIME_API`, host:port)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(':')
        self.host, self.port = host, int(port)

    def _connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=None)

    def next(self) -> tuple[dict[str, Any], InvocationContext, str | None]:
        """Wait for the next invocation: its event, its context and its X-Ray trace header."""
        connection = self._connection()
        try:
            connection.request('GET', f'{RUNTIME_PATH}/invocation/next')
            response = connection.getresponse()
            body = response.read()
            headers = {k.lower(): v for k, v in response.getheaders()}
        finally:
            connection.close()
        context = InvocationContext(
            headers['lambda-runtime-aws-request-id'],
            int(headers.get('lambda-runtime-deadline-ms') or 0),
            headers.get('lambda-runtime-invoked-function-arn', ''),
        )
        return json.loads(body), context, headers.get('lambda-runtime-trace-id')

    def post_error(self, path: str, error: BaseException) -> None:
        """Report a failed invocation (or init) as the managed runtimes do."""
        body = json.dumps(
            {
                'errorMessage': str(error),
                'errorType': type(error).__name__,
                'stackTrace': traceback.format_tb(error.__traceback__),
            }
        ).encode()
        connection = self._connection()
        try:
            connection.request(
                'POST',
                f'{RUNTIME_PATH}/{path}',
                body=body,
                headers={'Lambda-Runtime-Function-Error-Type': 'Unhandled', 'Content-Type': 'application/json'},
            )
            connection.getresponse().read()
        finally:
            connection.close()

    def stream_response(self, request_id: str, prelude: dict[str, Any], body: Iterable[bytes]) -> None:
        """POST the answer as a stream: the prelude and its delimiter, then each piece of `body` as it comes. A failure
        while making the body goes into the trailers (API Gateway then ends the client's response); a connection that
        breaks stops the writing, not the reading of `body` (the work behind it finishes)."""
        connection = self._connection()
        broken = False

        def write(data: bytes) -> None:
            nonlocal broken
            if broken:
                return
            try:
                _chunk(connection, data)
            except OSError:
                broken = True
                logger.warning('the response stream to Lambda broke; the answer is still finished')

        try:
            connection.putrequest('POST', f'{RUNTIME_PATH}/invocation/{request_id}/response', skip_accept_encoding=True)
            connection.putheader('Lambda-Runtime-Function-Response-Mode', 'streaming')
            connection.putheader('Transfer-Encoding', 'chunked')
            connection.putheader('Content-Type', INTEGRATION_RESPONSE)
            connection.putheader('Trailer', _TRAILERS)
            connection.endheaders()
            write(json.dumps(prelude).encode() + PRELUDE_DELIMITER)
            trailers = b''
            try:
                for piece in body:
                    if piece:
                        write(piece)
            except Exception as exc:  # noqa: BLE001 - reported to Lambda in the trailers, as its runtimes do
                logger.exception('the streamed answer failed')
                detail = base64.b64encode(json.dumps({'errorMessage': str(exc)}).encode()).decode()
                trailers = (
                    f'Lambda-Runtime-Function-Error-Type: {type(exc).__name__}\r\n'
                    f'Lambda-Runtime-Function-Error-Body: {detail}\r\n'
                ).encode()
            if not broken:
                connection.send(b'0\r\n' + trailers + b'\r\n')
                connection.getresponse().read()
        except OSError:
            logger.warning('the Runtime API did not take the whole response')
        finally:
            connection.close()


def _chunk(connection: http.client.HTTPConnection, data: bytes) -> None:
    connection.send(b'%x\r\n%s\r\n' % (len(data), data))


def prelude_of(result: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """The HTTP integration prelude and the body of a proxy result (`statusCode`, `headers`, `body`)."""
    headers = {str(k): str(v) for k, v in (result.get('headers') or {}).items()}
    multi = {str(k): [str(v) for v in vs] for k, vs in (result.get('multiValueHeaders') or {}).items() if vs}
    cookies = [c for k, vs in multi.items() if k.lower() == 'set-cookie' for c in vs]
    multi = {k: v for k, v in multi.items() if k.lower() != 'set-cookie'}
    prelude: dict[str, Any] = {'statusCode': int(result.get('statusCode', 200)), 'headers': headers}
    if multi:
        prelude['multiValueHeaders'] = multi
    if cookies:
        prelude['cookies'] = cookies
    raw = result.get('body') or ''
    body = base64.b64decode(raw) if result.get('isBase64Encoded') else str(raw).encode()
    return prelude, body


def serve(api: RuntimeApi, handler: Handler, *, invocations: int | None = None) -> None:
    """Answer invocations until the environment is frozen and shut down (or `invocations` were answered)."""
    from functions.api import streaming

    done = 0
    while invocations is None or done < invocations:
        event, context, trace = api.next()
        if trace:
            os.environ['_X_AMZN_TRACE_ID'] = trace
        try:
            with streaming.accepting_streams():
                result = handler(event, context)
                pending = streaming.take_pending()
        except Exception as exc:  # noqa: BLE001 - one failed invocation, as Lambda reports it
            logger.exception('the handler failed')
            api.post_error(f'invocation/{context.aws_request_id}/error', exc)
        else:
            prelude, body = prelude_of(result)
            api.stream_response(context.aws_request_id, prelude, pending.frames() if pending is not None else [body])
            if pending is not None:
                pending.wait()  # the turn's own last steps (metrics, logs) before the environment may freeze
                _flush_metrics()
        done += 1


def _flush_metrics() -> None:
    from functions._observability import metrics

    try:
        metrics.flush_metrics()
    except Exception:  # noqa: BLE001 - metrics are best effort
        logger.exception('flushing metrics failed')


def main() -> int:
    """The runtime's entry point (`python -m functions.api.stream_runtime`)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    api = RuntimeApi(os.environ['AWS_LAMBDA_RUNTIME_API'])
    try:
        handler = load_handler(os.environ.get('_HANDLER') or 'functions.api.handler.lambda_handler')
    except Exception as exc:  # noqa: BLE001 - Lambda reports an init failure from this
        api.post_error('init/error', exc)
        return 1
    serve(api, handler)
    return 0


if __name__ == '__main__':
    sys.exit(main())
