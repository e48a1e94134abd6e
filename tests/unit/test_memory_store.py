from __future__ import annotations

import pytest

from om_lib.adapters.memory.store import InMemoryStore
from tests.store_conformance import (
    AttentionConformance,
    ScopedThreadIdsConformance,
    StoreConformance,
    WorkingMemoryConformance,
)


class TestInMemoryStore(StoreConformance, ScopedThreadIdsConformance, AttentionConformance, WorkingMemoryConformance):
    @pytest.fixture
    def store(self):
        return InMemoryStore()
