from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from .models import ApiToken

NAME_MAX = ApiToken._meta.get_field("name").max_length


class TokenCreateForm(forms.Form):
    """The desk's form: a person makes a token for themselves, with a label."""

    name = forms.CharField(
        label="What is it for?",
        max_length=NAME_MAX,
        help_text="A label to tell your tokens apart, e.g. “laptop” or “billing agent”.",
    )


class TokenAdminAddForm(forms.ModelForm):
    """The admin's add form: whom the token acts as and its label; the token itself is
    made by ``apitoken_create`` and shown once on the next page."""

    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True).order_by("username"),
        help_text="The token acts as this person, with their permissions.",
    )

    class Meta:
        model = ApiToken
        fields = ["user", "name"]
