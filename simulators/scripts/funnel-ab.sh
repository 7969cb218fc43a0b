#!/usr/bin/env bash
# Compares cloud builds on the 3-step funnel of an `opgraph-history` store
# (BENCHMARKS.md, "Queries at 10 M events"). For each binary given, in
# order: start it on the store, wait for /api/health, one warm-up call,
# then CALLS calls of POST /api/funnels/query; print the p50 of curl's wall
# time and of the process's CPU time (utime + stime) per call, every
# call's figures, and the answer. CPU time is reported because wall time
# on a shared machine mostly measures the other load.
#
#   OPGRAPH_DATA_DIR=/tmp/og10m simulators/scripts/funnel-ab.sh old/opgraph-cloud new/opgraph-cloud old/opgraph-cloud new/opgraph-cloud
#
# FROM and TO (epoch ms) fix the range so that every run reads the same
# rows; by default they cover 2026-10-25 to 2026-11-26.
set -euo pipefail
: "${OPGRAPH_DATA_DIR:?set OPGRAPH_DATA_DIR to a store written by opgraph-history generate}"
FROM=${FROM:-1792886400000}
TO=${TO:-1795651200000}
CALLS=${CALLS:-7}
PORT=${PORT:-18080}
KEY=og_benchkey000000000000000000000000
BODY="{\"steps\":[{\"event\":\"page.view\"},{\"event\":\"cart.add\"},{\"event\":\"order.created\"}],\"from\":$FROM,\"to\":$TO}"
TCK=$(getconf CLK_TCK)
ANSWER=$(mktemp)
trap 'rm -f "$ANSWER"' EXIT

call() {
    curl -s -o "$ANSWER" -w '%{time_total}' -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -d "$BODY" "http://127.0.0.1:$PORT/api/funnels/query"
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

for bin in "$@"; do
    OPGRAPH_HTTP_ADDR=127.0.0.1:$PORT OPGRAPH_GRPC_ADDR=off OPGRAPH_QUIC_ADDR=off \
        OPGRAPH_BOOTSTRAP_KEY=$KEY OPGRAPH_RATE_LIMIT_RPS=0 "$bin" > /dev/null 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do
        curl -sf "http://127.0.0.1:$PORT/api/health" > /dev/null && break
        kill -0 "$pid" 2> /dev/null || { echo "$bin exited before serving" >&2; exit 1; }
        sleep 1
    done
    call > /dev/null
    walls=() cpus=()
    for _ in $(seq 1 "$CALLS"); do
        before=$(cpu_ticks "$pid")
        wall=$(call)
        after=$(cpu_ticks "$pid")
        walls+=("$(awk -v w="$wall" 'BEGIN {printf "%d", w * 1000}')")
        cpus+=("$(( (after - before) * 1000 / TCK ))")
    done
    echo "$bin: wall p50 $(median "${walls[@]}") ms, CPU p50 $(median "${cpus[@]}") ms;" \
        "walls ${walls[*]}; CPU ${cpus[*]}; load $(cut -d' ' -f1 /proc/loadavg)"
    echo "  answer: $(cat "$ANSWER")"
    kill -TERM "$pid"
    wait "$pid" || true
done
