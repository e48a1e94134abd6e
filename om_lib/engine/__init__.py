"""`MemoryEngine` and its runners.

- `engine`: `MemoryEngine`, composed from the rooms over one configuration and its ports.
- `step`: the step and the turn, around every Actor call.
- `jobs`: background work: the worker's jobs, the scheduled sweep, the operations a client runs on demand.
- `rooms`: what the step runner and the job runner both work over.
- `actor_context`: what the Actor sees for one step (memory system message, reminders, visible messages, status).

May import: `om_lib.history` and everything below it. Imported by `om_lib.conversation`, `om_lib.service` and the
composition root that builds a `MemoryEngine` (`functions._wiring`); never by a handler, route or CLI command.
"""
