"""A thread's history and what is kept beside the observation log.

- `threads`: a resource's threads, filtered and ordered.
- `history`: message queries, cloning a thread, deleting messages.
- `forgetting`: when messages are deleted, what was derived from them goes too.
- `recall`: the `recall` tool: raw messages behind the observations, threads, search, the archive.
- `semantic`: semantic search over raw messages (`retrieval: {vector: true}`, `semanticRecall`).
- `working_memory`: the block the agent keeps about the user.
- `titles`: thread titles a model proposes after the first turn.

May import: `om_lib.reflection` (recall pages the archive), `om_lib.observation` (resource scope's thread ids) and
everything below them. The engine's jobs run `titles`; nothing here imports the engine.
"""
