"""Template libraries: ``approvals_format`` (the desk's formatting), ``standing``,
``analytics_tags``. Top floor: may read every room; no room imports them."""
