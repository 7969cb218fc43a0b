#!/usr/bin/env bash
# Installs the system packages the test suite needs, only when missing, so
# that a fresh machine and a warm one run the same command.
set -euo pipefail

# command-to-check  debian-package
needs=(
  "openssl openssl"        # generates JWT and TLS keys for the tests
  "sqlite3 sqlite3"        # tamper tests edit the embedded store directly
  "mosquitto mosquitto"    # external MQTT broker; tests start their own on loopback
  "mount mount"            # edge_faults mounts a small tmpfs as a full disk
  "mkfs.ext4 e2fsprogs"    # power-cut tests: ext4 on a loop device (tests/src/loop_disk.rs)
  "pkill procps"           # procps brings /bin/kill, which the harness runs (`kill` alone is a shell builtin)
  "systemd-analyze systemd"  # checks the units in deploy/systemd/ offline; nothing is started
  "clickhouse-server clickhouse-server"  # the ClickHouse store's tests start their own server on loopback
  "clickhouse-client clickhouse-client"  # raw-SQL baselines and debugging of those servers
  "python3 python3"        # runs the ClickHouse SQL check on chdb (below)
  # the ClickHouse cluster test's replication and ON CLUSTER DDL; tests
  # start their own on loopback (the package brings a Java runtime)
  "/usr/share/zookeeper/bin/zkServer.sh zookeeper"
  # the SDKs' own test suites (tests/tests/sdks.rs): each SDK uses only its
  # language's standard library, so the toolchains are all they need
  "node nodejs"
  "go golang-go"
  "ruby ruby"
)

missing=()
for pair in "${needs[@]}"; do
  read -r cmd pkg <<<"$pair"
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing test dependencies: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # Packages must not start system services (mosquitto would take port
  # 1883, clickhouse-server 8123 and 9000): policy-rc.d answering 101
  # forbids it for the install.
  policy=/usr/sbin/policy-rc.d
  placed_policy=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    placed_policy=1
  fi
  cleanup() { [ -z "$placed_policy" ] || $sudo rm -f "$policy"; }
  trap cleanup EXIT
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # Where systemd runs anyway, keep the packaged broker off.
  if printf '%s\n' "${missing[@]}" | grep -qx mosquitto && command -v systemctl >/dev/null 2>&1 \
    && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now mosquitto >/dev/null 2>&1 || true
  fi
  if printf '%s\n' "${missing[@]}" | grep -qx clickhouse-server && command -v systemctl >/dev/null 2>&1 \
    && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now clickhouse-server >/dev/null 2>&1 || true
  fi
fi

# From PyPI: chdb embeds current ClickHouse in Python (a test runs every
# statement the ClickHouse store sent to Debian's 18.16 on it too);
# botocore is AWS's own request signer, which the S3 and Redshift exports'
# signatures are checked against.
if ! python3 -c 'import chdb, botocore' >/dev/null 2>&1; then
  echo "installing test dependencies: chdb, botocore (PyPI)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip
  fi
  # A Debian-managed Python refuses plain pip installs (PEP 668).
  python3 -m pip install --quiet chdb botocore 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages chdb botocore
fi

# From npm: the TypeScript compiler checks the JavaScript SDK's hand-written
# index.d.ts against its README's usage (cloud/sdk/js/types/check.ts, run by
# tests/tests/sdks.rs). Debian 12's node-typescript is 4.8, and the check
# is written against TypeScript 5, so it comes from npm (which Debian's
# nodejs package does not bring, hence the fallback).
if ! command -v tsc >/dev/null 2>&1; then
  echo "installing test dependencies: typescript@5 (npm)"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if ! command -v npm >/dev/null 2>&1; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm
  fi
  $sudo npm install --global --silent --no-audit --no-fund typescript@5
fi
