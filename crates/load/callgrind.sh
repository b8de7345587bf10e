#!/bin/bash
# The service's own instructions per event, counted by callgrind: repeatable to about
# a percent for the same binary and load, where CPU time on these shared 2-core
# machines moves by ±10% between runs. Run it on an otherwise quiet machine: beside a
# compile the server falls further behind, its groups grow and the count falls (a pass
# of 857 M instructions measured 703 M).
#
#   crates/load/callgrind.sh [SERVER_BINARY] [streaming|single]
#
# Runs `agent-stream-load many-runs` with 40 runs (800 events/s; callgrind runs the server
# some 50x slower than native) twice, for 5 s and for 10 s, with the server under
# `valgrind --tool=callgrind`, and prints the instructions the second pass spent more
# divided by the events it appended more: the cost of an event without the server's
# start-up and the runs' opening. Needs valgrind, a release build of the load tool
# (`cargo build --release -p agent-stream-load`) and DATABASE_URL (default: the local
# PostgreSQL on 127.0.0.1:5432, database `test`).
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${1:-$here/target/release/agent-stream}")
mode=${2:-streaming}
load=${LOAD_BIN:-$here/target/release/agent-stream-load}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The load tool kills the server it started with SIGKILL, which would lose callgrind's
# counts: the wrapper leaves valgrind running in the background, and this script stops
# it with SIGTERM (the service then shuts down and callgrind writes its file).
cat > "$work/server" <<EOF
#!/bin/bash
valgrind --tool=callgrind --callgrind-out-file="\$CG_OUT" "$bin" "\$@" &
wait
EOF
chmod +x "$work/server"

pass() {
    local secs=$1 out="$work/cg.$1"
    CG_OUT=$out AGENT_STREAM_BIN="$work/server" MANY_RUNS=40 MANY_SECS=$secs MANY_MODE=$mode \
        "$load" many-runs > "$work/log.$secs" 2>&1
    local pid
    pid=$(pgrep -f "callgrind-out-file=$out " | head -1)
    kill "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done
    local events ir
    events=$(awk -F'|' '/^\| agent-stream/ {split($7, a, "/"); print a[2] + 0}' "$work/log.$secs")
    ir=$(awk '/^totals:/ {print $2}' "$out")
    echo "$events $ir"
}

read -r e5 i5 < <(pass 5)
read -r e10 i10 < <(pass 10)
echo "$mode, $(basename "$(dirname "$bin")")/$(basename "$bin"): 5 s: $e5 events, $i5 instructions; 10 s: $e10 events, $i10 instructions"
echo "instructions per event: $(( (i10 - i5) / (e10 - e5) ))"
