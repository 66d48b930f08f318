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
