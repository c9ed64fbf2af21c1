"""Django's ModelBackend, with a user's permissions read in one statement.

ModelBackend reads a user's own permissions and their groups' permissions in two
queries, on every page that asks ``has_perm`` (the nav, the queue, the approval page).
Here the two are one UNION: the same set, the same caches (``_perm_cache``, and the
per-source caches ``get_user_permissions``/``get_group_permissions`` fill when asked
on their own), the same answers for inactive, anonymous and superusers."""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission


class DeskModelBackend(ModelBackend):
    def get_all_permissions(self, user_obj, obj=None):
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            names = ("content_type__app_label", "codename")
            if user_obj.is_superuser:
                perms = Permission.objects.values_list(*names).order_by()
            else:
                own = Permission.objects.filter(user=user_obj).values_list(*names).order_by()
                via_groups = Permission.objects.filter(group__user=user_obj).values_list(*names).order_by()
                perms = own.union(via_groups).order_by()
            user_obj._perm_cache = {f"{app_label}.{codename}" for app_label, codename in perms}
        return user_obj._perm_cache
