"""PostgreSQL and Redis for the benches: started as CI starts them, with databases of the bench's own.

    from services import ensure_services, fresh_databases, redis_url
    ensure_services()                                  # bash .ci/services (idempotent)
    desk_url, world_url = fresh_databases("cs_soak")   # cs_soak and cs_soak_world, dropped and created empty
    broker = redis_url(14)                             # redis://127.0.0.1:6379/14

Each bench passes its own prefix and Redis db number so that benches (and tests) running
at the same time never share a database.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
USER = PASSWORD = "countersign"  # the superuser role .ci/services creates


def ensure_services() -> None:
    """Start PostgreSQL and Redis on 127.0.0.1 (installing them if missing), as CI does."""
    result = subprocess.run(["bash", str(ROOT / ".ci" / "services")], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f".ci/services failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")


def database_url(name: str) -> str:
    return f"postgres://{USER}:{PASSWORD}@{HOST}:5432/{name}"


def fresh_databases(prefix: str) -> tuple[str, str]:
    """Drop and create ``prefix`` (the desk's database) and ``prefix_world`` (the world's); their URLs.

    Only ever give a prefix of your own: the databases are dropped without asking."""
    import psycopg

    names = (prefix, f"{prefix}_world")
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        for name in names:
            quoted = '"' + name.replace('"', '""') + '"'
            conn.execute(f"DROP DATABASE IF EXISTS {quoted} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {quoted}")
    return database_url(names[0]), database_url(names[1])


def redis_url(db: int) -> str:
    return f"redis://{HOST}:6379/{db}"


def flush_redis(db: int) -> None:
    """Empty one Redis database (a bench's own): no messages left over from an earlier run."""
    import redis

    redis.Redis.from_url(redis_url(db)).flushdb()
