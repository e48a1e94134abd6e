"""What an agent's client asks for, around the engine.

- `conversation`: a step and a turn as an agent sees them: working memory, recalled messages, tool declarations and
  titles around the engine's step.
- `chat`: the chat service behind `POST /threads/{threadId}/chat`: one step, one Actor call and one turn.

May import: `om_lib.engine` and everything below it. Only `om_lib.service` imports it.
"""
