import pytest
from django.contrib.auth.models import Permission

from tests.approvals.slack_kit import REVIEWERS, SECRET, SENIORS
from tests.slack_fake import FakeSlack


@pytest.fixture
def outsider(django_user_model):
    """May decide approvals, but is in no group."""
    user = django_user_model.objects.create_user("outsider", email="outsider@countersign.local")
    user.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    return user


@pytest.fixture
def fake(settings):
    """A fake Slack Web API on 127.0.0.1, and the desk configured to use it."""
    with FakeSlack() as slack:
        settings.DESK_SLACK_BOT_TOKEN = "xoxb-test-token"
        settings.DESK_SLACK_SIGNING_SECRET = SECRET
        settings.DESK_SLACK_API_URL = slack.url
        settings.DESK_SLACK_CHANNELS = {"reviewers": REVIEWERS, "senior-reviewers": SENIORS}
        yield slack
