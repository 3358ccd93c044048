#!/usr/bin/env bash
# What `make test` adds to scripts/setup.sh's install (run first): the test and vision
# extras, and where the OS package manager allows it PostgreSQL, Chromium, haproxy and
# nginx, and the agent CLIs where npm is. Each test that needs what could not be installed
# skips, saying why. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/apt.sh
. scripts/apt.sh

[ -x .venv/bin/python ] || { echo "error: no .venv: run scripts/setup.sh first (make does)" >&2; exit 1; }

# The tests start a throw-away PostgreSQL server of their own (tests/postgres.py) for the
# shared index; they skip, saying why, where none can be installed.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null; then
  apt_install postgresql \
    || echo "note: could not install postgresql; the shared-index tests will be skipped" >&2
fi

# The dashboard's browser test drives Debian's Chromium through chromedriver (Selenium, from
# the test extra); it skips, saying why, where they cannot be installed.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver \
    || echo "note: could not install chromium and chromium-driver; the dashboard's browser test will be skipped" >&2
fi

# The session-routing tests and bench run Debian's HAProxy and nginx from the files in
# docs/proxy/, as an unprivileged user on free ports (tests/proxies.py); they skip, saying
# why, where these cannot be installed. The packages' own services (nginx's default site
# on port 80) are not needed: the ones installed here are stopped and disabled.
for proxy in haproxy nginx; do
  if ! command -v "$proxy" >/dev/null && [ ! -x "/usr/sbin/$proxy" ]; then  # sbin: off a user's PATH
    if apt_install "$proxy"; then
      as_root systemctl disable --now "$proxy" >/dev/null 2>&1 || true
    else
      echo "note: could not install $proxy; its session-routing tests will be skipped" >&2
    fi
  fi
done

# The vision extra too: the tests serve vision-language models.
.venv/bin/python -m pip install -q -e ".[test,vision]"
# The real agent CLIs the end-to-end tests drive, into .agents/ (not globally), where npm is.
if command -v npm >/dev/null && command -v node >/dev/null; then
  ./scripts/install-agents.sh || echo "note: could not install the agent CLIs; their tests will say why" >&2
fi
