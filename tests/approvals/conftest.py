import pytest
from django.contrib.auth.models import Permission


@pytest.fixture
def outsider(django_user_model):
    """May decide approvals, but is in no group."""
    user = django_user_model.objects.create_user("outsider", email="outsider@countersign.local")
    user.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    return user
