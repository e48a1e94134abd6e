"""The in-memory reference implementations, for unit tests, single-process local runs and library users.

- `store`: `InMemoryStore`, the behaviour every `MemoryStore` must match (the conformance suite runs against each).
- `vectors`: `InMemoryVectorIndex`, the same quantised scoring as DynamoDB.
- `events`: `InMemoryEventLog`, lifecycle events kept in a list.

May import: the shared modules of `om_lib`.
"""
