"""Adapters for agent frameworks; each needs its extra (`openai-agents`, `strands`, `mcp`)."""
