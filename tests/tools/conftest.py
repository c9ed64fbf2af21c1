import pytest

from tools.demo import seed_world


@pytest.fixture
def world():
    """The demo orders, customers and tickets in the world database."""
    seed_world()
