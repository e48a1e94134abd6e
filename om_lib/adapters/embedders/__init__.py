"""`Embedder` on each provider, for semantic search.

- `gemini`, `bedrock`, `openai`: each reuses its language-model adapter's client (`om_lib.adapters.models`).
- `local`: all-MiniLM-L6-v2 on the CPU in numpy, offline (the `local-embeddings` extra).

May import: `om_lib.adapters.models` and the shared modules of `om_lib`.
"""
