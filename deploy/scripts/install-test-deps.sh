#!/usr/bin/env bash
# Installs the system packages the test suite needs, only when missing, so
# that a fresh machine and a warm one run the same command.
set -euo pipefail

# command-to-check  debian-package
needs=(
  "openssl openssl"        # generates JWT and TLS keys for the tests
  "sqlite3 sqlite3"        # tamper tests edit the embedded store directly
)

missing=()
for pair in "${needs[@]}"; do
  read -r cmd pkg <<<"$pair"
  command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing test dependencies: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
