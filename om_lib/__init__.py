"""Observational memory for LLM agents: the domain library (config, messages, tokens, Observer, Reflector, engine).

`om_lib.OMConfig` is the configuration document (CONTRACT §1), `om_lib.MemoryEngine` the engine over your ports and
`om_lib.MemoryService` the façade the API and workers call (steps, turns, chat, memory, history, threads). They are
resolved lazily, so importing a light submodule (say `om_lib.context.tokens`) does not pay for pydantic's models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from om_lib.config import OMConfig
    from om_lib.engine.engine import MemoryEngine
    from om_lib.service import MemoryService

__all__ = ['MemoryEngine', 'MemoryService', 'OMConfig']


def __getattr__(name: str) -> Any:
    if name == 'OMConfig':
        from om_lib.config import OMConfig

        return OMConfig
    if name == 'MemoryEngine':
        from om_lib.engine.engine import MemoryEngine

        return MemoryEngine
    if name == 'MemoryService':
        from om_lib.service import MemoryService

        return MemoryService
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
