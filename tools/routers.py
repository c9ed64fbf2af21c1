from __future__ import annotations

WORLD_APPS = {"tools"}


class WorldRouter:
    """The sandbox world (app ``tools``) lives in the ``world`` database.

    It stands in for external systems, so its writes are never part of a
    run's transaction on ``default``.
    """

    def db_for_read(self, model, **hints):
        return "world" if model._meta.app_label in WORLD_APPS else "default"

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        return (obj1._meta.app_label in WORLD_APPS) == (obj2._meta.app_label in WORLD_APPS)

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return (app_label in WORLD_APPS) == (db == "world")
