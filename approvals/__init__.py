"""The gate and the desk: one Django app (label ``approvals``) in four rooms, each
importing only the rooms below it: record <- policy <- decisions <- notify.
On top: gate (DESK_GATE), admin, urls, analytics, templatetags, commands."""
