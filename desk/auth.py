"""Django's ModelBackend, with a user's permissions and groups read in one statement.

ModelBackend reads a user's own permissions and their groups' permissions in two
queries, on every page that asks ``has_perm`` (the nav, the queue, the approval page),
and the queue reads the user's groups in a third (which approvals they may decide).
Here the three are one UNION: the same permission set and caches (``_perm_cache``; the
per-source caches ``get_user_permissions``/``get_group_permissions`` fill when asked on
their own), the same answers for inactive, anonymous and superusers, and the ids of the
user's groups as ``user._desk_group_ids`` (what approvals.review.selectors reads
before it queries them itself)."""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db.models import CharField, Value
from django.db.models.functions import Cast

# The first column of a group's row in the union: no app label has a space.
GROUP_ROW = "group id"


class DeskModelBackend(ModelBackend):
    def get_all_permissions(self, user_obj, obj=None):
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            names = ("content_type__app_label", "codename")
            if user_obj.is_superuser:
                rows = Permission.objects.values_list(*names).order_by()
            else:
                own = Permission.objects.filter(user=user_obj).values_list(*names).order_by()
                via_groups = Permission.objects.filter(group__user=user_obj).values_list(*names).order_by()
                groups = (
                    Group.objects.filter(user=user_obj)
                    .annotate(row=Value(GROUP_ROW, output_field=CharField()), text=Cast("pk", CharField()))
                    .values_list("row", "text")
                    .order_by()
                )
                rows = own.union(via_groups, groups).order_by()
            perms, group_ids = set(), set()
            for first, second in rows:
                if first == GROUP_ROW:
                    group_ids.add(int(second))
                else:
                    perms.add(f"{first}.{second}")
            user_obj._perm_cache = perms
            if not user_obj.is_superuser:
                user_obj._desk_group_ids = group_ids
        return user_obj._perm_cache
