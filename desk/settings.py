"""One settings file, configured by environment variables with safe defaults.

A fresh checkout runs with no configuration: SQLite files under ``var/``, an
embedded (file-system) Celery broker, email kept in a database outbox (DEBUG) or
printed (console), the scripted LLM.
Production switches by environment only: DATABASE_URL, WORLD_DATABASE_URL,
CELERY_BROKER_URL, EMAIL_URL, ANTHROPIC_API_KEY, DESK_BASE_URL, SECRET_KEY,
ALLOWED_HOSTS and the HTTPS switches, each named as the setting it sets.

DEBUG is off unless DEBUG=1 (``make run`` sets it, and writes it to var/local.env,
which a local desk's processes read; tests need neither). With DEBUG off, outside
tests, the process refuses to start without SECRET_KEY and ALLOWED_HOSTS, so a known
key is never used in production.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote, urlparse

import dj_database_url
from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

from core.sealing import KeyRingError, new_key, parse_ring

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DESK_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a whole number.") from None


def env_bool(name: str, default: bool = False) -> bool:
    # Strict: a typo in a security switch ("ture") must not quietly mean off.
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={os.environ[name]!r}: use 1, true, yes, on or 0, false, no, off.")


def env_list(name: str, default: str = "") -> list[str]:
    return [part.strip() for part in env_str(name, default).split(",") if part.strip()]


def parse_proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """SECURE_PROXY_SSL_HEADER given as "HEADER,value", e.g. "HTTP_X_FORWARDED_PROTO,https"."""
    if not value.strip():
        return None
    header, comma, expected = (part.strip() for part in value.partition(","))
    # Django compares request.META[header]: a header written as it travels on the
    # wire ("X-Forwarded-Proto") would never match, and HTTPS would go unnoticed.
    if not comma or not re.fullmatch(r"HTTP_[A-Z0-9_]+", header) or not expected or "," in expected:
        raise ImproperlyConfigured(
            f'SECURE_PROXY_SSL_HEADER={value!r} is not "HEADER,value": give the request.META name of '
            "the header your proxy sets and the value that means HTTPS, e.g. "
            "SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https"
        )
    return header, expected


TESTING = "pytest" in sys.modules or env_bool("DESK_TESTING")


def local_env_path() -> Path | None:
    """The local desk's environment file: DESK_LOCAL_ENV (empty or "off": none), by
    default var/local.env. Never under test, so a developer's demo desk cannot change
    what the suite sees."""
    if TESTING:
        return None
    chosen = os.environ.get("DESK_LOCAL_ENV")
    if chosen is None:
        return VAR_DIR / "local.env"
    return None if chosen.strip().lower() in ("", "off") else Path(chosen)


def local_env_load(path: Path | None) -> None:
    """`make run` writes var/local.env (DEBUG=1): on the desk it made, manage.py works
    without exporting anything. KEY=VALUE lines, # comments; the environment wins.
    A production machine has no such file, so there DEBUG stays off and the keys
    stay required."""
    if path is None or not path.is_file():
        return
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, equals, value = line.partition("=")
        name = name.strip().removeprefix("export ").strip()
        if not equals or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
            raise ImproperlyConfigured(f"{path}, line {number}: not NAME=value.")
        os.environ.setdefault(name, value.strip())


local_env_load(local_env_path())
DEBUG = env_bool("DEBUG")

if not DEBUG and not TESTING:
    missing = [name for name in ("SECRET_KEY", "ALLOWED_HOSTS") if not env_str(name).strip()]
    if missing:
        raise ImproperlyConfigured(
            f"DEBUG is off, so Countersign will not start without {' and '.join(missing)}. "
            "In production set SECRET_KEY (50+ random characters) and ALLOWED_HOSTS (the desk's "
            'host names, comma-separated); see docs/operators.md, "Production environment". '
            "For a local desk set DEBUG=1 instead (make run does, in var/local.env)."
        )

# A known key only ever goes with DEBUG on (a local desk). Tests get a random one
# (tests/support.py hands it to the processes a test starts).
LOCAL_SECRET_KEY = "django-insecure-countersign-local-desk-only"
SECRET_KEY = (
    env_str("SECRET_KEY").strip()
    or (secrets.token_urlsafe(50) if TESTING else "")
    or (LOCAL_SECRET_KEY if DEBUG else "")
)
if SECRET_KEY == LOCAL_SECRET_KEY and not DEBUG:
    raise ImproperlyConfigured("SECRET_KEY is the local desk's published key: set a secret one.")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "axes",
    "tools",
    "runs",
    "approvals",
    "ninja",  # serves the API docs' Swagger UI from our static files, no CDN
    "api",
    "ops",  # operator commands that read across the apps
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Static files from the web process itself (production: what collectstatic wrote).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs login unless a view opts out with @login_not_required.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as django-axes asks: turns a locked-out sign-in into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "desk.urls"
WSGI_APPLICATION = "desk.wsgi.application"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "approvals.decisions.context_processors.nav",
            ],
        },
    }
]


# --- Databases -------------------------------------------------------------
# SQLite by default: WAL so readers never block the writer, IMMEDIATE
# transactions so two writers queue on the lock instead of failing on upgrade,
# synchronous=FULL so a commit survives power loss (durable checkpoints).
SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=FULL;PRAGMA busy_timeout=20000",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}


def database_from_url(url: str, test_name: str) -> dict:
    # CONN_MAX_AGE (seconds, default 0: a connection per request) keeps connections
    # open between requests in production; health checks drop a dead one first.
    config = dj_database_url.parse(url, conn_max_age=env_int("CONN_MAX_AGE", 0), conn_health_checks=True)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = dict(SQLITE_OPTIONS)
        # Cross-process tests (a real worker, concurrent deciders) need the
        # test database to be a file every process can open.
        # One file per test process, so two suites can run side by side.
        config["TEST"] = {"NAME": str(VAR_DIR / f"{os.getpid()}-{test_name}")}
    else:
        config["TEST"] = {"NAME": test_name.replace(".sqlite3", "").replace("-", "_")}
    return config


DATABASES = {
    "default": database_from_url(
        env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'desk.sqlite3'}"), "test-desk.sqlite3"
    ),
    # The sandbox world stands in for external systems: its own database, so
    # its effects are never inside a run's transaction.
    "world": database_from_url(
        env_str("WORLD_DATABASE_URL", f"sqlite:///{VAR_DIR / 'world.sqlite3'}"),
        "test-world.sqlite3",
    ),
}
DATABASE_ROUTERS = ["tools.routers.WorldRouter"]
# A Celery worker child keeps its connections (desk and world) between tasks for this
# many seconds (0: a new one per task, Celery's default): a new PostgreSQL connection
# was ~30 ms of every decision's resume. Health-checked and closed as Django does
# around a request, before and after each task (desk/celery.py), so one the database
# dropped is replaced, not failed on. Celery's own close around every task is then
# turned off (its db_reuse_max). Count 2 per child against max_connections.
DESK_WORKER_CONN_MAX_AGE = env_int("DESK_WORKER_CONN_MAX_AGE", 600)
if DESK_WORKER_CONN_MAX_AGE:
    CELERY_DB_REUSE_MAX = 10**9
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --- Sign-in throttling (django-axes) ----------------------------------------
# A username tried from one address is locked out after DESK_LOGIN_FAILURE_LIMIT
# failures for DESK_LOGIN_COOLOFF_MINUTES; a failure meanwhile starts the wait
# over, a successful sign-in clears the count. Keyed on username *and* address,
# so a stranger guessing cannot lock a reviewer out of the desk from elsewhere.
# The address is REMOTE_ADDR: behind a proxy every client shares the proxy's, and
# the lockout is then in effect per username.
AUTHENTICATION_BACKENDS = [
    # First: refuses a locked-out username and address before any password is checked.
    "axes.backends.AxesStandaloneBackend",
    "desk.auth.DeskModelBackend",
]
AXES_FAILURE_LIMIT = env_int("DESK_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("DESK_LOGIN_COOLOFF_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"


# --- HTTPS -------------------------------------------------------------------
# Each variable is named as the setting it sets. Off by default, so the local
# desk works over plain HTTP; docs/operators.md "Production environment" turns them on.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT")
# Health checks and the metrics scrape come from inside the network, over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD")
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE")
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
SECURE_PROXY_SSL_HEADER = parse_proxy_ssl_header(env_str("SECURE_PROXY_SSL_HEADER"))

# --- Content Security Policy -------------------------------------------------
# Strict: only the desk's own files, no inline script, style or event handler
# (templates/base.html tells htmx not to inject its indicator <style> and never
# to eval). Django's admin and debug pages work under it as they are.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "object-src": [CSP.NONE],
    "base-uri": [CSP.NONE],
    "frame-ancestors": [CSP.NONE],
    "form-action": [CSP.SELF],
}

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
# In production the web process serves the static files (whitenoise): `collectstatic`
# writes them to STATIC_ROOT with a hash of their content in each name (and gzip and
# brotli copies), pages link the hashed names, and whitenoise serves those with a
# year's cache. A local desk (DEBUG) and the tests serve static/ as it is (runserver,
# `runserver --insecure` with DEBUG off under test): no collectstatic, no manifest.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG or TESTING
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
# Under test STATIC_ROOT does not exist: look files up per request instead of listing
# the folder once at start (which warns about the missing folder, an error in tests).
WHITENOISE_AUTOREFRESH = DEBUG or TESTING


# --- Celery ----------------------------------------------------------------
# Default broker: kombu's file-system transport under var/broker, so `make run`
# needs no Redis. Production sets CELERY_BROKER_URL=redis://...
BROKER_DIR = Path(env_str("DESK_BROKER_DIR", str(VAR_DIR / "broker")))
# Under pytest the test process itself never talks to a broker (a nudge goes
# nowhere); cross-process tests hand their subprocesses a real one.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "memory://" if TESTING else "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem"):
    for sub in ("queue", "processed", "control", "inflight"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        # desk/broker.py: a fetched message waits here until acked; one still here
        # after a lease lost its worker and goes back on the queue (as on Redis).
        "inflight_folder": str(BROKER_DIR / "inflight"),
        "visibility_timeout": env_int("DESK_LEASE_SECONDS", 60),
        "store_processed": False,
        "polling_interval": 0.2,
    }
# Two queues. "celery" (the default) carries the runs' nudges; "notify" carries the
# desk's email, digests, webhooks and the SLA sweep (approvals.notify), consumed by a
# worker of its own (Procfile, Procfile.production), so a nudge never waits behind an
# email being rendered or an SMTP server being slow. Routed by task name: callers
# call .delay() as before. A worker started without -Q consumes "celery" only.
NOTIFY_QUEUE = "notify"
CELERY_TASK_ROUTES = {
    name: {"queue": NOTIFY_QUEUE}
    for name in (
        "approvals.tasks.send_notification",
        "approvals.tasks.send_digests",
        "approvals.tasks.sweep_sla",
        "approvals.tasks.deliver_webhook",
        "approvals.tasks.send_slack_message",
        "approvals.tasks.sweep_outbox",
        "approvals.tasks.anchor_chains",
    )
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# The database is the source of truth: a lost or repeated message is only a
# lost or repeated nudge. Ack late so a crashed worker's nudge is redelivered.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
if CELERY_BROKER_URL.startswith(("redis", "rediss")):
    # Redis redelivers a message its worker never acked after this long. At or below
    # the lease, so a nudge held by a dead worker comes back no later than the sweep
    # would send another. A countdown longer than this (an email retry) may be
    # delivered twice: every task claims its row, so a repeat does nothing.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("DESK_LEASE_SECONDS", 60)}
# A task running longer than this is killed (prefork pool only) and its run
# recovered from its last checkpoint once the lease expires. Generous: a run
# advances until it pauses, many model calls in one task.
CELERY_TASK_TIME_LIMIT = env_int("DESK_TASK_TIME_LIMIT", 1800)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# How often beat sweeps leases: see runs.tasks.sweep_leases.
DESK_SWEEP_SECONDS = env_int("DESK_SWEEP_SECONDS", 5)
DESK_OUTBOX_SWEEP_SECONDS = env_int("DESK_OUTBOX_SWEEP_SECONDS", 2)
CELERY_BEAT_SCHEDULE = {
    "sweep-expired-leases": {
        "task": "runs.tasks.sweep_leases",
        "schedule": float(DESK_SWEEP_SECONDS),
    },
    # Approval reminders, escalations and expiries per rule.
    "sweep-approval-sla": {
        "task": "approvals.tasks.sweep_sla",
        "schedule": float(env_int("DESK_SLA_SWEEP_SECONDS", 60)),
    },
    # The hourly digest of the emails people chose to receive that way.
    "send-notification-digests": {
        "task": "approvals.tasks.send_digests",
        "schedule": crontab(minute=env_int("DESK_DIGEST_MINUTE", 0)),
    },
    # Emails and webhook deliveries due for 2 s (their nudge was lost) or cut off
    # mid-send, sent from the database (approvals.notify.outbox). A sweep's message
    # expires after one period: a stopped notify worker finds one, not hundreds.
    "sweep-outbox": {
        "task": "approvals.tasks.sweep_outbox",
        "schedule": float(DESK_OUTBOX_SWEEP_SECONDS),
        "options": {"expires": float(DESK_OUTBOX_SWEEP_SECONDS)},
    },
    # External and MCP sessions no call reached for DESK_SESSION_IDLE_SECONDS.
    "close-idle-sessions": {
        "task": "runs.tasks.close_idle_sessions",
        "schedule": 60.0,
    },
}
# The audit chains' heads, signed, written outside the database (approvals.record.audit):
# appended to DESK_ANCHOR_DIR/anchors.jsonl (empty: no file) and sent as the
# audit.anchor webhook; `manage.py verify --against FILE` checks against them.
DESK_ANCHOR_DIR = env_str("DESK_ANCHOR_DIR", str(VAR_DIR / "anchors"))
DESK_ANCHOR_SECONDS = env_int("DESK_ANCHOR_SECONDS", 3600)
if DESK_ANCHOR_SECONDS > 0:
    CELERY_BEAT_SCHEDULE["anchor-audit-chains"] = {
        "task": "approvals.tasks.anchor_chains",
        "schedule": float(DESK_ANCHOR_SECONDS),
    }
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")


# --- Email -----------------------------------------------------------------
# EMAIL_URL: outbox:// keeps each email in the database, listed at /desk/outbox/
# (the default with DEBUG on: `make run`); console:// prints it (the default with
# DEBUG off); locmem:// keeps it in memory;
# smtp://user:pass@host:port (smtp+tls:// for STARTTLS, smtps:// for TLS).
def mailer_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme == "outbox" or (not url and DEBUG):
        return {"BACKEND": "desk.mail.DatabaseBackend"}
    if not url or parsed.scheme == "console":
        return {"BACKEND": "django.core.mail.backends.console.EmailBackend"}
    if parsed.scheme == "locmem":
        return {"BACKEND": "django.core.mail.backends.locmem.EmailBackend"}
    if parsed.scheme not in ("smtp", "smtp+tls", "smtps"):
        raise ValueError(f"EMAIL_URL: unsupported scheme {parsed.scheme!r}")
    return {
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": parsed.hostname or "localhost",
            "port": parsed.port,
            "username": unquote(parsed.username or "") or None,
            "password": unquote(parsed.password or "") or None,
            "use_tls": parsed.scheme == "smtp+tls",
            "use_ssl": parsed.scheme == "smtps",
            "timeout": 10,
        },
    }


MAILERS = {"default": mailer_from_url(env_str("EMAIL_URL"))}
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Countersign <desk@countersign.local>")
# First retry of a failed SMTP send after up to this many seconds, doubling (jittered).
DESK_EMAIL_RETRY_SECONDS = env_int("DESK_EMAIL_RETRY_SECONDS", 10)
# A notification still "sending" this long after its claim lost its worker mid-send
# and is sent again (same Message-ID). The SMTP exchange has a 10 s timeout per
# command (EMAIL_URL), so no live send takes this long.
DESK_EMAIL_SENDING_SECONDS = env_int("DESK_EMAIL_SENDING_SECONDS", 120)


# --- Countersign -----------------------------------------------------------
DESK_BASE_URL = env_str("DESK_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
DESK_GATE = env_str("DESK_GATE", "approvals.gate.RuleGate")
DESK_LEASE_SECONDS = env_int("DESK_LEASE_SECONDS", 60)
# How long a reviewer's claim on an approval keeps others off it.
DESK_CLAIM_SECONDS = env_int("DESK_CLAIM_SECONDS", 300)
# Who decides a guard that tripped on a run (budget, stuck, verify, outcome), and after
# how long pending its reviewers are reminded (escalated after twice that). A guard
# never expires: it waits for a person.
DESK_GUARD_GROUP = env_str("DESK_GUARD_GROUP", "reviewers")
DESK_GUARD_SLA_MINUTES = env_int("DESK_GUARD_SLA_MINUTES", 30)
# Keys the hashes of the audit chains and checkpoint digests (HMAC-SHA-256), so that
# someone who can write to the database cannot recompute them after changing a row.
# Kept outside the database, and stable: with another key every record fails verify.
DESK_INTEGRITY_KEY = env_str("DESK_INTEGRITY_KEY").strip() or SECRET_KEY
# Encryption at rest (core/sealing.py): "id:key,id:key", the first key seals what is
# written, every key opens; separate from SECRET_KEY and DESK_INTEGRITY_KEY, and kept
# out of the database and its backups (docs/operators.md "Backups"). With DEBUG off the desk will
# not start without it. A local desk (DEBUG) reads var/encryption-keys, which make run
# writes; tests get a random key (tests/support.py hands it on). "off": clear text, for
# benchmarks that measure what sealing costs.
LOCAL_KEYS_FILE = VAR_DIR / "encryption-keys"
DESK_ENCRYPTION_KEYS = env_str("DESK_ENCRYPTION_KEYS").strip()
if not DESK_ENCRYPTION_KEYS and TESTING:
    DESK_ENCRYPTION_KEYS = new_key("test")
if not DESK_ENCRYPTION_KEYS and DEBUG and LOCAL_KEYS_FILE.is_file():
    DESK_ENCRYPTION_KEYS = LOCAL_KEYS_FILE.read_text().strip()
if not DESK_ENCRYPTION_KEYS:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DEBUG is off, so Countersign will not start without DESK_ENCRYPTION_KEYS (id:key, "
            "the key 32 random bytes in URL-safe base64: python -m core.sealing newkey prints one); "
            'see docs/operators.md, "Encryption at rest".'
        )
    DESK_ENCRYPTION_KEYS = "off"
try:
    parse_ring(DESK_ENCRYPTION_KEYS)
except KeyRingError as exc:
    raise ImproperlyConfigured(str(exc)) from None
DESK_MAX_STEPS = env_int("DESK_MAX_STEPS", 50)
DESK_LLM_MAX_ATTEMPTS = env_int("DESK_LLM_MAX_ATTEMPTS", 6)
DESK_DEMO_PASSWORD = env_str("DESK_DEMO_PASSWORD", "correct-horse-battery" if TESTING else "")
# The onboarding agent's files: real files, but never outside this folder.
DESK_SANDBOX_DIR = Path(env_str("DESK_SANDBOX_DIR", str(VAR_DIR / "sandbox")))
# External agents. The MCP gateway: how long a gated tools/call waits for its decision
# before answering "pending approval N", and upstream MCP servers to proxy (JSON:
# {"agent-name": {"command": ["python", "server.py"]} or {"url": "http://..."}}).
DESK_MCP_WAIT_SECONDS = env_int("DESK_MCP_WAIT_SECONDS", 60)
try:
    DESK_MCP_UPSTREAMS = json.loads(env_str("DESK_MCP_UPSTREAMS", "{}") or "{}")
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(f"DESK_MCP_UPSTREAMS is not valid JSON: {exc}") from None
# An external or MCP session no call reached for this long (its client disconnected or
# went away) is closed by beat ("Ended: client idle 15 min"); 0: never. A later call
# under its name opens a new session (runs.external).
DESK_SESSION_IDLE_SECONDS = env_int("DESK_SESSION_IDLE_SECONDS", 900)
# The longest a GET /api/v1/calls/{id}?wait=N long poll may hold a request.
DESK_API_MAX_WAIT_SECONDS = env_int("DESK_API_MAX_WAIT_SECONDS", 60)
# A request body: at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes (Django's 2.5 MB default;
# more answers 413 too_large) and a form at most DATA_UPLOAD_MAX_NUMBER_FIELDS fields.
# Neither counts a JSON body's keys: the API and /mcp/ take at most this many keys and
# array items in one, all levels together (api.bodies; more answers 413 too_many_fields).
DESK_API_MAX_BODY_KEYS = env_int("DESK_API_MAX_BODY_KEYS", 10_000)
# Webhooks are delivered only to http(s) URLs on these hosts (comma-separated).
DESK_WEBHOOK_ALLOWED_HOSTS = [host.lower() for host in env_list("DESK_WEBHOOK_ALLOWED_HOSTS")]
# First retry of a failed webhook delivery after up to this many seconds, doubling (jittered).
DESK_WEBHOOK_RETRY_SECONDS = env_int("DESK_WEBHOOK_RETRY_SECONDS", 10)
# Slack (approvals.notify.slack): with no bot token nothing Slack happens. The token and
# the signing secret live here only (never in the database, never logged). The Web
# API's base URL can be a proxy or a test's fake. DESK_SLACK_CHANNELS: JSON, group
# name -> channel id, the default mapping that SlackChannel rows in the admin extend.
DESK_SLACK_BOT_TOKEN = env_str("DESK_SLACK_BOT_TOKEN").strip()
DESK_SLACK_SIGNING_SECRET = env_str("DESK_SLACK_SIGNING_SECRET").strip()
DESK_SLACK_API_URL = env_str("DESK_SLACK_API_URL", "https://slack.com/api/").strip()
if not DESK_SLACK_API_URL.endswith("/"):
    DESK_SLACK_API_URL += "/"
try:
    DESK_SLACK_CHANNELS = json.loads(env_str("DESK_SLACK_CHANNELS", "{}") or "{}")
except json.JSONDecodeError as exc:
    raise ImproperlyConfigured(
        f"DESK_SLACK_CHANNELS is not valid JSON ({exc}): group name -> channel id, "
        'e.g. {"reviewers": "C0123"}.'
    ) from None
if not isinstance(DESK_SLACK_CHANNELS, dict) or not all(
    isinstance(k, str) and isinstance(v, str) for k, v in DESK_SLACK_CHANNELS.items()
):
    raise ImproperlyConfigured(
        'DESK_SLACK_CHANNELS: a JSON object of group name -> channel id, e.g. {"reviewers": "C0123"}.'
    )
# A Slack message "sending" this long counts as cut off (its worker died after Slack
# may have taken it): the outbox sweep takes it back, and its post looks for itself.
DESK_SLACK_SENDING_SECONDS = env_int("DESK_SLACK_SENDING_SECONDS", 60)
# Off: irreversible calls, calls with warnings and calls needing two or more approvers
# have no Approve button in Slack (they are decided in the desk). On: they do.
DESK_SLACK_APPROVE_GUARDED = env_bool("DESK_SLACK_APPROVE_GUARDED", False)
# /metrics (Prometheus text format) answers a request that carries this token
# ("Authorization: Bearer ..."), or comes from one of these networks (CIDR,
# comma-separated; the default is this machine only). Empty token and networks: 404.
DESK_METRICS_TOKEN = env_str("DESK_METRICS_TOKEN").strip()
DESK_METRICS_NETWORKS = env_list("DESK_METRICS_NETWORKS", "127.0.0.1/32,::1/128")
# Retention (purgeruns; runs.retention): argument fields named here (e.g. "to,email")
# are replaced in stored payloads of finished runs older than DESK_REDACT_AFTER_DAYS
# (0: never), by the same command.
DESK_REDACT_FIELDS = env_list("DESK_REDACT_FIELDS")
DESK_REDACT_AFTER_DAYS = env_int("DESK_REDACT_AFTER_DAYS", 0)
# Agents: the team's own agent modules (importable, comma-separated; each registers its
# agents and tools on import), imported by every process after the built-in ones, which
# DESK_BUILT_IN_AGENTS=0 leaves out (a production desk that runs only its own agents).
# A tool call running longer than DESK_TOOL_TIMEOUT_SECONDS (or its tool's own
# ``timeout``) is stopped (tools.loading, runs.engine.execution; docs/agents.md).
DESK_AGENTS = env_list("DESK_AGENTS")
DESK_BUILT_IN_AGENTS = env_bool("DESK_BUILT_IN_AGENTS", True)
DESK_TOOL_TIMEOUT_SECONDS = env_int("DESK_TOOL_TIMEOUT_SECONDS", 30)
if DESK_TOOL_TIMEOUT_SECONDS < 1:
    raise ImproperlyConfigured(f"DESK_TOOL_TIMEOUT_SECONDS={DESK_TOOL_TIMEOUT_SECONDS}: at least 1 second.")
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY")
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL") or None
ANTHROPIC_MODEL = env_str("ANTHROPIC_MODEL", "claude-sonnet-4-6")

# The desk's loggers print through the root's handler, once: a Celery worker replaces
# the root's handlers with its own (a handler on each logger as well printed every line
# twice in the worker).
# LOG_FORMAT=json: one JSON object per line (core.logs.JsonFormatter), with the run,
# step and call a line is about.
LOG_FORMAT = env_str("LOG_FORMAT", "text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use text or json.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "core.logs.JsonFormatter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            **({"formatter": "json"} if LOG_FORMAT == "json" else {}),
        }
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "desk": {"level": env_str("DESK_LOG_LEVEL", "INFO")},
        "runs": {"level": env_str("DESK_LOG_LEVEL", "INFO")},
        "approvals": {"level": env_str("DESK_LOG_LEVEL", "INFO")},
    },
}
