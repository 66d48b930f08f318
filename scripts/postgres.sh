# Sourced by scripts: makes sure a Postgres server answers at DATABASE_URL,
# starting this machine's local cluster when it is the one that is down.

: "${DATABASE_URL:=postgres://postgres@127.0.0.1:5432/shepherd}"
export DATABASE_URL

ensure_postgres() {
  if pg_isready -q -d "$DATABASE_URL" 2>/dev/null; then
    return 0
  fi
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    echo "Postgres is not answering; starting the local cluster $version/main" >&2
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 30); do
      pg_isready -q -d "$DATABASE_URL" 2>/dev/null && return 0
      sleep 1
    done
  fi
  echo "No Postgres answers at $DATABASE_URL." >&2
  echo "Start one with 'docker compose up -d postgres', or install the postgresql package, or set DATABASE_URL." >&2
  return 1
}

# Creates the database named in DATABASE_URL when it is missing (the tests'
# per-test databases are made from a connection to it).
ensure_database() {
  if psql "$DATABASE_URL" -Atqc 'select 1' >/dev/null 2>&1; then
    return 0
  fi
  local name="${DATABASE_URL##*/}"
  name="${name%%\?*}"
  psql "${DATABASE_URL%/*}/postgres" -qc "create database \"$name\"" >/dev/null
}
