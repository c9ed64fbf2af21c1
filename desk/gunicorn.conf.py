"""gunicorn's configuration for the desk's web process (Procfile.production):

    gunicorn desk.wsgi --config desk/gunicorn.conf.py

Read from the environment, like the desk's settings (docs/operators.md "Running it for real").

gthread workers, not sync: the JSON API's long poll (GET /api/v1/calls/{id}?wait=N, up
to DESK_API_MAX_WAIT_SECONDS) and the MCP gateway's gated calls (DESK_MCP_WAIT_SECONDS)
hold a request for up to a minute while a person decides. A sync worker would spend a
whole process on each, and be killed as silent after `timeout`; a gthread worker spends
one thread, its main loop keeps answering the master, and the other threads keep
serving the desk. Each busy thread holds one database connection while it works
(CONN_MAX_AGE, 0 by default: closed after each request): workers x threads, plus two per
Celery child (which keep theirs, DESK_WORKER_CONN_MAX_AGE), must stay below the
database's max_connections.
"""

from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"{name}={value!r} is not a whole number.") from None


# PORT as Heroku-style platforms and honcho give it; GUNICORN_BIND for anything else
# (several addresses, comma-separated, or unix:/path).
bind = [address.strip() for address in os.environ.get("GUNICORN_BIND", "").split(",") if address.strip()] or [
    f"0.0.0.0:{_int('PORT', 8000)}"
]

# Processes: the usual 2 x cores + 1, capped at 8 (each process is a whole Django, ~80 MB;
# the threads carry the concurrency). WEB_CONCURRENCY overrides, as on most platforms.
workers = _int("WEB_CONCURRENCY", min(2 * (os.cpu_count() or 1) + 1, 8))
worker_class = "gthread"
threads = _int("GUNICORN_THREADS", 8)

# The longest a request may be held on purpose: a long poll or a gated MCP call
# (the same variables and defaults as desk/settings.py).
_longest_wait = max(_int("DESK_API_MAX_WAIT_SECONDS", 60), _int("DESK_MCP_WAIT_SECONDS", 60))
# For gthread this bounds a worker whose main loop stopped (a hung process), not a
# request; above the longest wait all the same, so that a long poll would survive even
# under sync workers.
timeout = _longest_wait + 30
# On restart (a deploy, HUP) a worker finishes its requests first: a long poll in
# flight gets its answer instead of a reset connection.
graceful_timeout = _longest_wait + 10
# Behind a proxy that keeps connections open to us.
keepalive = 5
# A fresh process now and then, staggered, bounds what a slow leak can grow to.
max_requests = 2000
max_requests_jitter = 200

# The access log on stdout (one line per request, with its duration), errors on stderr.
accesslog = "-"
errorlog = "-"
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms "%(a)s"'
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")

# Workers' heartbeat files in memory where there is /dev/shm (containers' /tmp may be
# on a slow overlay disk, and a late heartbeat reads as a hung worker).
if os.path.isdir("/dev/shm"):
    worker_tmp_dir = "/dev/shm"

# gunicorn's control socket (gunicornc) defaults to one path per user, which two desks
# (or a desk and a bench) on one machine would share: only where asked for.
if os.environ.get("GUNICORN_CONTROL_SOCKET"):
    control_socket = os.environ["GUNICORN_CONTROL_SOCKET"]
else:
    control_socket_disable = True


def post_worker_init(worker) -> None:
    """Once the worker has loaded the desk: connect to the broker, so that the first
    decision this process takes does not pay for it before its run's nudge leaves
    (~1 s on a cold worker)."""
    import gc

    from runs.tasks import broker_warm

    broker_warm()
    # What is loaded now lives as long as the worker: the garbage collector leaves it
    # alone, and its collections walk only what requests make (desk/celery.py).
    gc.freeze()
