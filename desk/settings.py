"""One settings file, configured by environment variables with safe defaults.

A fresh checkout runs with no configuration: SQLite files under ``var/``, an
embedded (file-system) Celery broker, console email, the scripted LLM.
Production switches by environment only: DATABASE_URL, WORLD_DATABASE_URL,
CELERY_BROKER_URL, EMAIL_URL, ANTHROPIC_API_KEY, DESK_BASE_URL, SECRET_KEY,
ALLOWED_HOSTS.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DESK_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "")
    if not value.strip():
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str = "") -> list[str]:
    return [part.strip() for part in env_str(name, default).split(",") if part.strip()]


TESTING = "pytest" in sys.modules or env_bool("DESK_TESTING")

SECRET_KEY = env_str("SECRET_KEY", "dev-only-insecure-key-change-me")
DEBUG = env_bool("DEBUG", default=not os.environ.get("SECRET_KEY"))
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", "127.0.0.1,localhost")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "tools",
    "runs",
    "approvals",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Every page needs login unless a view opts out with @login_not_required.
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
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
                "approvals.context_processors.nav",
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
    config = dj_database_url.parse(url, conn_max_age=0)
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LANGUAGE_CODE = "en"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"


# --- Celery ----------------------------------------------------------------
# Default broker: kombu's file-system transport under var/broker, so `make run`
# needs no Redis. Production sets CELERY_BROKER_URL=redis://...
BROKER_DIR = Path(env_str("DESK_BROKER_DIR", str(VAR_DIR / "broker")))
# Under pytest the test process itself never talks to a broker (a nudge goes
# nowhere); cross-process tests hand their subprocesses a real one.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "memory://" if TESTING else "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem"):
    for sub in ("queue", "processed", "control"):
        (BROKER_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),
        "store_processed": False,
        "polling_interval": 0.2,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# The database is the source of truth: a lost or repeated message is only a
# lost or repeated nudge. Ack late so a crashed worker's nudge is redelivered.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "sweep-expired-leases": {
        "task": "runs.tasks.sweep_leases",
        "schedule": float(env_int("DESK_SWEEP_SECONDS", 30)),
    },
    # Approval reminders, escalations and expiries per rule; re-sends lost email nudges.
    "sweep-approval-sla": {
        "task": "approvals.tasks.sweep_sla",
        "schedule": float(env_int("DESK_SLA_SWEEP_SECONDS", 60)),
    },
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")


# --- Email -----------------------------------------------------------------
# EMAIL_URL: unset or console:// prints mail; locmem:// keeps it in memory;
# smtp://user:pass@host:port (smtp+tls:// for STARTTLS, smtps:// for TLS).
def mailer_from_url(url: str) -> dict:
    parsed = urlparse(url)
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


# --- Countersign -----------------------------------------------------------
DESK_BASE_URL = env_str("DESK_BASE_URL", "http://127.0.0.1:8000").rstrip("/")
DESK_GATE = env_str("DESK_GATE", "approvals.gate.RuleGate")
DESK_LEASE_SECONDS = env_int("DESK_LEASE_SECONDS", 60)
# How long a reviewer's claim on an approval keeps others off it.
DESK_CLAIM_SECONDS = env_int("DESK_CLAIM_SECONDS", 300)
DESK_MAX_STEPS = env_int("DESK_MAX_STEPS", 50)
DESK_LLM_MAX_ATTEMPTS = env_int("DESK_LLM_MAX_ATTEMPTS", 6)
DESK_DEMO_PASSWORD = env_str("DESK_DEMO_PASSWORD", "correct-horse-battery" if TESTING else "")
# The onboarding agent's files: real files, but never outside this folder.
DESK_SANDBOX_DIR = Path(env_str("DESK_SANDBOX_DIR", str(VAR_DIR / "sandbox")))
ANTHROPIC_API_KEY = env_str("ANTHROPIC_API_KEY")
ANTHROPIC_BASE_URL = env_str("ANTHROPIC_BASE_URL") or None
ANTHROPIC_MODEL = env_str("ANTHROPIC_MODEL", "claude-sonnet-4-6")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "desk": {"handlers": ["console"], "level": env_str("DESK_LOG_LEVEL", "INFO")},
        "runs": {"handlers": ["console"], "level": env_str("DESK_LOG_LEVEL", "INFO")},
        "approvals": {"handlers": ["console"], "level": env_str("DESK_LOG_LEVEL", "INFO")},
    },
}
