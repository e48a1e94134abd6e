"""A Strands agent whose conversation lives in Observational Memory, with the recall tool.

    python3 dev.py om serve &                                  # the local stack on http://127.0.0.1:8787
    export OPENAI_BASE_URL=https://api.openai.com/v1 OPENAI_API_KEY=...  # or any OpenAI-compatible endpoint
    .venv/bin/python examples/strands_agent.py [--model gpt-4o-mini] [--thread-id trip]

Before each invocation the hooks save your message and load memory into the agent (system prompt plus unobserved
messages); after it they save the turn. Type a message per line; Ctrl-D ends. `--message TEXT` sends one and exits.
"""

from __future__ import annotations

import argparse
import os
import sys

from om_client import MemoryClient
from om_client.integrations.strands import ObservationalMemoryHooks
from strands import Agent
from strands.models.openai import OpenAIModel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--api-url', default=os.environ.get('OM_API_URL', 'http://127.0.0.1:8787'))
    parser.add_argument('--resource-id', default='me')
    parser.add_argument('--thread-id', default='strands-chat')
    parser.add_argument('--model', default=os.environ.get('OM_EXAMPLE_MODEL', 'gpt-4o-mini'))
    parser.add_argument('--message', help='send this one message and exit')
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    client_args = {'base_url': os.environ.get('OPENAI_BASE_URL'), 'api_key': os.environ.get('OPENAI_API_KEY')}
    model = OpenAIModel(client_args={k: v for k, v in client_args.items() if v}, model_id=args.model)
    with MemoryClient(args.api_url, resource_id=args.resource_id) as om:
        memory = ObservationalMemoryHooks(om, thread_id=args.thread_id)
        agent = Agent(
            model=model,
            system_prompt='You are a helpful assistant. Use what you remember about the user.',
            hooks=[memory],
            tools=[memory.recall_tool()],
            callback_handler=None,
        )
        lines = [args.message] if args.message else (line.strip() for line in sys.stdin)
        for text in lines:
            if not text:
                continue
            print(f'assistant: {agent(text)}'.rstrip())
            status = om.memory(args.thread_id)
            print(
                f'  [memory: {status.observation_tokens} observation tokens, '
                f'{status.pending_message_tokens} unobserved message tokens]',
                file=sys.stderr,
            )
    return 0


if __name__ == '__main__':
    sys.exit(main())
