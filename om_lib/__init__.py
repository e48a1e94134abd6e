"""Observational memory for LLM agents: the domain library (config, messages, tokens, Observer, Reflector, engine).

`om_lib.OMConfig` is the configuration document (CONTRACT §1). It is resolved lazily, so importing a light submodule
(say `om_lib.tokens`) does not pay for pydantic's models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from om_lib.config import OMConfig
    from om_lib.engine import MemoryEngine

__all__ = ['MemoryEngine', 'OMConfig']


def __getattr__(name: str) -> Any:
    if name == 'OMConfig':
        from om_lib.config import OMConfig

        return OMConfig
    if name == 'MemoryEngine':
        from om_lib.engine import MemoryEngine

        return MemoryEngine
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
