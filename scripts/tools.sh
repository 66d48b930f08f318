# Sourced by scripts: the outside tools some tests run, fetched when this
# machine lacks them. Nothing is installed system-wide: the tool is taken
# out of its Debian package into target/tools.

# promtool (from Debian's prometheus package) checks /metrics and tests the
# alert rules in deploy/. Sets SHEPHERD_PROMTOOL.
ensure_promtool() {
  if [ -n "${SHEPHERD_PROMTOOL:-}" ] && [ -x "$SHEPHERD_PROMTOOL" ]; then
    return 0
  fi
  if command -v promtool >/dev/null 2>&1; then
    SHEPHERD_PROMTOOL=$(command -v promtool)
    export SHEPHERD_PROMTOOL
    return 0
  fi
  local bin="$PWD/target/tools/promtool"
  if [ ! -x "$bin" ]; then
    local work
    work=$(mktemp -d)
    echo "fetching promtool from Debian's prometheus package into target/tools" >&2
    if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
      apt-get update -qq >/dev/null 2>&1 || true
      if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
        echo "cannot download Debian's prometheus package (for promtool); install it, or set SHEPHERD_PROMTOOL" >&2
        rm -rf "$work"
        return 1
      fi
    fi
    dpkg -x "$work"/prometheus_*.deb "$work/x"
    mkdir -p "$(dirname "$bin")"
    cp "$work/x/usr/bin/promtool" "$bin"
    rm -rf "$work"
  fi
  SHEPHERD_PROMTOOL="$bin"
  export SHEPHERD_PROMTOOL
}

# Debian's chromium and chromium-driver, for the browser test of the pages
# (workers/tests/http.rs drives them over WebDriver). Installed from the
# distribution when missing, as the test suite needs them.
ensure_chromium() {
  if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    return 0
  fi
  echo "installing Debian's chromium and chromium-driver for the browser test" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  if ! $sudo apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
    $sudo apt-get update -qq >/dev/null 2>&1 || true
    if ! $sudo apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; then
      echo "cannot install chromium and chromium-driver; install them, or set SHEPHERD_CHROMIUM and SHEPHERD_CHROMEDRIVER" >&2
      return 1
    fi
  fi
}

# PgBouncer 1.21 or later (protocol-level prepared statements, which sqlx
# uses on every query) for the tests that run workers behind it in
# transaction mode. Debian 12 ships 1.18, which cannot carry them, so
# when no new enough pgbouncer is at hand, Debian 13's source package is
# fetched (apt checks its signature against Debian's archive key) and
# built into target/tools: about ten seconds here. Needs libevent's
# headers, pkg-config, make and a C compiler (Debian's packages, installed
# when missing, as chromium is).
# Sets SHEPHERD_PGBOUNCER.
PGBOUNCER_SUITE=trixie
ensure_pgbouncer() {
  if [ -n "${SHEPHERD_PGBOUNCER:-}" ] && [ -x "$SHEPHERD_PGBOUNCER" ]; then
    return 0
  fi
  local found
  found=$(command -v pgbouncer 2>/dev/null || true)
  if [ -n "$found" ] && pgbouncer_new_enough "$found"; then
    SHEPHERD_PGBOUNCER="$found"
    export SHEPHERD_PGBOUNCER
    return 0
  fi
  local bin="$PWD/target/tools/pgbouncer"
  if [ ! -x "$bin" ] || ! pgbouncer_new_enough "$bin"; then
    build_pgbouncer "$bin" || return 1
  fi
  SHEPHERD_PGBOUNCER="$bin"
  export SHEPHERD_PGBOUNCER
}

# True when the pgbouncer at $1 is 1.21 or later.
pgbouncer_new_enough() {
  local v major minor
  v=$("$1" --version 2>/dev/null | sed -n 's/^PgBouncer \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1)
  read -r major minor <<<"$v"
  [ -n "${major:-}" ] && { [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge 21 ]; }; }
}

build_pgbouncer() {
  local bin="$1" work sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
  fi
  # configure finds libevent only through pkg-config; a minimal Debian
  # lacks pkg-config and make as well as the headers.
  if ! command -v pkg-config >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1 ||
    ! command -v cc >/dev/null 2>&1 || ! pkg-config --exists libevent 2>/dev/null; then
    local needs="pkg-config make gcc libevent-dev"
    echo "installing Debian's $needs to build pgbouncer" >&2
    # shellcheck disable=SC2086
    if ! $sudo apt-get install -y -qq $needs >/dev/null 2>&1; then
      $sudo apt-get update -qq >/dev/null 2>&1 || true
      # shellcheck disable=SC2086
      if ! $sudo apt-get install -y -qq $needs >/dev/null 2>&1; then
        echo "cannot install $needs to build pgbouncer; install pgbouncer 1.21 or later, or set SHEPHERD_PGBOUNCER" >&2
        return 1
      fi
    fi
  fi
  work=$(mktemp -d)
  echo "building pgbouncer from Debian's $PGBOUNCER_SUITE source package into target/tools" >&2
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $PGBOUNCER_SUITE main" >"$work/sources.list"
  local apt=(apt-get -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
  if ! "${apt[@]}" update -qq >"$work/log" 2>&1 ||
    ! (cd "$work/src" && "${apt[@]}" source --download-only pgbouncer >>"$work/log" 2>&1); then
    cat "$work/log" >&2
    echo "cannot fetch Debian's pgbouncer source package; install pgbouncer 1.21 or later, or set SHEPHERD_PGBOUNCER" >&2
    rm -rf "$work"
    return 1
  fi
  tar -xzf "$work"/src/pgbouncer_*.orig.tar.gz -C "$work/src"
  if ! (cd "$work"/src/pgbouncer-*/ &&
    ./configure --without-cares --without-pam --without-systemd --without-openssl >>"$work/log" 2>&1 &&
    make -j2 >>"$work/log" 2>&1); then
    tail -30 "$work/log" >&2
    echo "building pgbouncer failed (log above); install pgbouncer 1.21 or later, or set SHEPHERD_PGBOUNCER" >&2
    rm -rf "$work"
    return 1
  fi
  mkdir -p "$(dirname "$bin")"
  cp "$work"/src/pgbouncer-*/pgbouncer "$bin"
  rm -rf "$work"
  pgbouncer_new_enough "$bin"
}
