"""The rules of the Actor's context window, pure (no I/O, no clock, no settings of its own).

- `tokens`: how text and messages are counted (o200k plus the reference's message overheads).
- `thresholds`: when observation and reflection are due, and the buffering boundaries.
- `context`: how the observation log becomes the memory system message (markup, groups, relative dates).
- `temporal`: where a gap in time is marked for the Actor and the Observer.
- `idle`: when buffered observations activate early (the thread was idle, the Actor's model changed).

May import: the shared modules at the top of `om_lib` (messages, ports, ...). `om_lib.config` reads its defaults from
here; `om_lib/engine/actor_context.py` composes these rules into what the Actor sees for one step.
"""
