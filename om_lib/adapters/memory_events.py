"""Kept so the import path the documentation gave keeps working: the class is in `om_lib.adapters.memory.events`."""

from om_lib.adapters.memory.events import InMemoryEventLog

__all__ = ['InMemoryEventLog']
