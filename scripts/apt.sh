# Sourced by scripts/setup.sh and scripts/setup-test.sh: Debian packages, as root or through
# passwordless sudo; each call returns non-zero where that is not possible.
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo "$@"; else return 1; fi; }
apt_updated=0
apt_install() {
  command -v apt-get >/dev/null || return 1
  if [ "$apt_updated" = 0 ]; then as_root apt-get update -qq || return 1; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
