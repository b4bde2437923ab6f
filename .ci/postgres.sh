#!/usr/bin/env bash
# Debian's PostgreSQL server binaries for the PostgreSQL suites, installed only where they are
# missing. Only the binaries are needed: the tests start a private cluster of their own
# (stello_graph/testing/postgres.py), so the packaged service is neither used nor started.
set -euo pipefail
found() {
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    return 0
  fi
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}
if found; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL's server binaries are missing; install them as root: apt-get install -y postgresql" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# policy-rc.d 101: the package must not start its own cluster service on this machine
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq postgresql >/dev/null
found
