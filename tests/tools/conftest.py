import pytest

from tools.refund_desk.agent import seed_world


@pytest.fixture
def world():
    """The demo orders, customers and tickets in the world database."""
    seed_world()
