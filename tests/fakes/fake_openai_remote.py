"""The fake OpenAI server, scripted over HTTP: for tests written in another language (the TypeScript client's Node
tests) that drive a real OpenAI-compatible client against it and script its replies the way Python tests do.

    POST /_fake/script    {"replies": [{"text": "..."} | {"toolCalls": [{"name", "arguments"}], "text"?} |
                                       {"status": 503, "message"?, "headers"?}]}  queue replies (then the default echo)
    GET  /_fake/requests  {"requests": [<chat completion request body>, ...]}  what the model was sent, in order
    POST /_fake/reset     forget scripts and the log
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any, cast

from tests.fakes.fake_openai import ChatReply, FakeOpenAI, ToolCall
from tests.fakes.loopback import JsonRequestHandler, parse_json

CONTROL = '/_fake/'


def reply_from_json(spec: dict[str, Any]) -> ChatReply:
    """A scripted reply from its JSON form."""
    if 'status' in spec and spec['status'] != 200:
        message = str(spec.get('message', 'scripted failure'))
        return ChatReply.error(int(spec['status']), message, headers=spec.get('headers'))
    calls = [ToolCall(str(c['name']), c.get('arguments', {})) for c in spec.get('toolCalls') or []]
    if calls:
        return ChatReply.tool_calls(*calls, text=spec.get('text'))
    return ChatReply.text(str(spec.get('text', '')))


class RemoteScriptedOpenAI(FakeOpenAI):
    """`FakeOpenAI` plus the `/_fake/*` control routes."""

    def _request_handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self
        base = cast(type[JsonRequestHandler], super()._request_handler())

        class Handler(base):  # type: ignore[valid-type, misc]
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self._route() == f'{CONTROL}requests':
                    self._send_json(200, {'requests': [r.body for r in fake.chat_requests]})
                else:
                    super().do_GET()

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                route = self._route()
                if not route.startswith(CONTROL):
                    super().do_POST()
                    return
                body = parse_json(self._read_body())
                if route == f'{CONTROL}script':
                    fake.script(*(reply_from_json(spec) for spec in body.get('replies') or []))
                    self._send_json(200, {'pending': fake.pending()})
                elif route == f'{CONTROL}reset':
                    fake.reset()
                    self._send_json(200, {})
                else:
                    self._send_json(404, {'error': f'no control route {route}: {json.dumps(sorted(body))}'})

        return Handler
