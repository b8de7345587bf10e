#!/bin/bash
# The service's own instructions per single-event append, counted by callgrind: an A/B
# that repeats to within 1% on a quiet machine, where CPU time on these
# shared 2-core machines moves by ±10% between runs.
#
#   crates/load/callgrind.sh [SERVER_BINARY] [APPENDS]
#
# Starts `SERVER_BINARY serve` (default target/release/agent-stream) under `valgrind
# --tool=callgrind` over a schema of its own, has 8 clients append single text deltas
# to a run each, a request at a time (400 to warm up, then APPENDS, default 2,000, with
# the counts zeroed between), and prints the server's instructions per append. The
# closed loop keeps the groups the same size from run to run; an open-loop load (a
# many-runs pass under callgrind, say) does not, because how far the slowed server falls
# behind sets its group sizes, and the count moved by 20% between runs of one build.
# User space only: the kernel's sends and receives are not counted. valgrind's CPU has
# no SHA extensions, so the API key's SHA-256 runs in software here (~7% of the count)
# where the service natively uses the CPU's. Needs valgrind,
# python3, curl, psql and DATABASE_URL (default: 127.0.0.1:5432, database `test`).
# CALLGRIND_KEEP=FILE keeps the measured profile there, for `callgrind_annotate
# --inclusive=yes FILE` to say where the instructions go. CALLGRIND_SSE=1 gives each
# client's run an SSE subscriber (native, `detail=full`, as many-runs has), and each
# client waits for its event to arrive there before the next append: the count per
# append then holds one delivery, each page one event, as closed-loop as the appends.
# CALLGRIND_STREAM=1 appends through one streaming append per client instead, a line
# at a time, each waiting for its acknowledgement: a group holds at most one line per
# client (~3 in all), as many-runs' groups are small (with CALLGRIND_SSE=1, many-runs'
# per-event work in user space). CALLGRIND_SUBSCRIBERS=K (with CALLGRIND_SSE=1) gives each
# run K subscribers instead of one, each append waiting for its frame on all K: the count
# with K less the count with 1, over K - 1, is what one more subscriber of a page costs,
# the per-subscriber share of fan-out that time measurements cannot resolve here.
# CALLGRIND_CLIENTS=N runs N clients instead of 8 (APPENDS a multiple of N): with 64
# streaming clients a group holds ~13 lines, nearer many-runs' larger groups.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(realpath "${1:-$here/target/release/agent-stream}")
appends=${2:-2000}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export RUST_LOG=error
schema=callgrind_$$
work=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    psql -q "$DATABASE_URL" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

"$bin" migrate --schema "$schema" >/dev/null
key=$("$bin" tenant create callgrind --schema "$schema" | tail -1)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$bin" serve --listen "127.0.0.1:$port" \
    --schema "$schema" --append-rate 0 --retention-interval 0 > "$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.5
done

# The producers: each makes a run and appends to it, one request in flight.
cat > "$work/drive.py" <<'EOF'
import http.client, json, os, socket, sys, threading
port, key, total = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
clients = int(os.environ.get("CALLGRIND_CLIENTS", "8"))
sse = sys.argv[4] == "1"
stream_mode = sys.argv[5] == "1"
subscribers = int(sys.argv[6])
headers = {"authorization": "Bearer " + key, "content-type": "application/json"}
def wait_for_frame(streams, seq):
    for stream in streams:
        wait_for_frame_on(stream, seq)
def wait_for_frame_on(stream, seq):
    # Read frames until the one of the event at `seq` (its seq is its id).
    while True:
        line = stream.readline()
        if not line:
            sys.exit("the stream ended")
        if line.startswith(b"id: ") and int(line[4:]) >= seq:
            return
def produce(i, done):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/runs", body=b"", headers=headers)
    run = json.loads(c.getresponse().read())["run_id"]
    streams = []
    for _ in range(subscribers if sse else 0):
        s = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        s.request("GET", f"/v1/runs/{run}/stream?detail=full", headers=headers)
        r = s.getresponse()
        assert r.status == 200, r.status
        streams.append(r)
    if stream_mode:
        # One streaming append per client (chunked NDJSON), a line at a time: each
        # line waits for its acknowledgement (and its frame) before the next, so a
        # group holds at most one line per client, as in many-runs' small groups.
        p = socket.create_connection(("127.0.0.1", port), timeout=600)
        p.sendall((f"POST /v1/runs/{run}/events/stream HTTP/1.1\r\nhost: x\r\n"
                   f"authorization: Bearer {key}\r\ncontent-type: application/x-ndjson\r\n"
                   "transfer-encoding: chunked\r\n\r\n").encode())
        acks = p.makefile("rb")
        for n in range(total // clients):
            line = json.dumps({"type": "text.delta", "payload": {"text": f"token {n} "}}).encode() + b"\n"
            p.sendall(b"%x\r\n" % len(line) + line + b"\r\n")
            while True:
                got = acks.readline()
                if not got:
                    sys.exit("the streaming append ended")
                if got.startswith(b"{"):
                    break
            answer = json.loads(got)
            if "last_seq" not in answer:
                sys.exit(f"the streaming append answered {got!r}")
            if sse:
                wait_for_frame(streams, answer["last_seq"])
            done[i] += 1
        p.sendall(b"0\r\n\r\n")
        return
    for n in range(total // clients):
        text = f"token {n} lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod"
        c.request("POST", f"/v1/runs/{run}/events", headers=headers,
                  body=json.dumps([{"type": "text.delta", "payload": {"text": text}}]))
        r = c.getresponse()
        answer = r.read()
        if r.status != 201:
            continue
        if sse:
            wait_for_frame(streams, json.loads(answer)["last_seq"])
        done[i] += 1
done = [0] * clients
threads = [threading.Thread(target=produce, args=(i, done)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(done))
EOF

sse=${CALLGRIND_SSE:-0}
streaming=${CALLGRIND_STREAM:-0}
subscribers=${CALLGRIND_SUBSCRIBERS:-1}
python3 "$work/drive.py" "$port" "$key" 400 "$sse" "$streaming" "$subscribers" >/dev/null
callgrind_control -z "$pid" >/dev/null 2>&1
written=$(python3 "$work/drive.py" "$port" "$key" "$appends" "$sse" "$streaming" "$subscribers")
callgrind_control -d "$pid" >/dev/null 2>&1
kill "$pid"
wait "$pid" || true
pid=
if [ "$written" != "$appends" ]; then
    echo "error: $written of $appends appends answered 201 (server log: $work/server.log)" >&2
    exit 1
fi
ir=$(awk '/^totals:/ {print $2}' "$work/cg.out.1")
[ -n "${CALLGRIND_KEEP:-}" ] && cp "$work/cg.out.1" "$CALLGRIND_KEEP"
what="single appends"
[ "$streaming" = 1 ] && what="streamed lines"
[ "$sse" = 1 ] && what="$what, each delivered to $subscribers subscriber(s)"
echo "$(basename "$(dirname "$bin")")/$(basename "$bin"): $appends $what, $ir instructions: $((ir / appends)) per append"
