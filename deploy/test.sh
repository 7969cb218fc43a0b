#!/usr/bin/env bash
# The one command that runs every test of Opgraph on a fresh machine:
# installs what the tests need, builds the binaries the end-to-end tests
# start, and runs the whole workspace's tests. Test servers bind to
# 127.0.0.1 only and stop by themselves.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/scripts/install-test-deps.sh
cargo build --workspace --bins
# The firmware codec must stay `no_std`: the firmware links it as it is.
cargo check -p opgraph-firmware-bridge --no-default-features --lib
cargo test --workspace "$@"
