from __future__ import annotations

import pytest

from tests.support import Desk


@pytest.fixture
def desk(transactional_db, tmp_path, demo):
    """Demo data committed to the file-backed test databases, and a Desk to drive them."""
    desk = Desk(tmp_path)
    yield desk
    desk.stop()
