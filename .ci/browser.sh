#!/usr/bin/env bash
# Debian's chromium for the inspector's browser tests, installed only where it is missing
# (Playwright drives it through executable_path: no browser is downloaded).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "chromium is missing; install it as root: apt-get install -y chromium" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq chromium >/dev/null
command -v chromium
