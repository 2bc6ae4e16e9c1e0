#!/usr/bin/env bash
# Load test of `gpulab serve` (docs/reliability.md): starts the server, runs tests/load/serve_load.py
# (N clients for D seconds, streaming and not, some leaving mid-stream), checks /metrics (KV empty
# afterwards, RSS flat after a warm-up round), then SIGTERMs the server during long streams: they
# must finish and the server must exit 0.
#   scripts/load_test.sh [--clients N] [--duration S] [--rounds R] [--device cpu|cuda] [--build DIR]
#                        [--json FILE] [-- SERVER_ARGS...]
# The duration is split into R rounds (default 2) on the same server; the first is the warm-up.
# Defaults: 256 clients, 60 s, the CPU engine on the tiny fixture (tests/data/llama_tiny). On the GPU:
#   scripts/load_test.sh --device cuda -- --config tests/data/llama3_8b_shape_test_vocab.json --dummy-weights \
#     --tokenizer tests/data/tokenizer_bytelevel
# (llama3-8b's shape over the test tokenizer's 1,024 ids: with llama3-8b's own 128k vocabulary,
# fewer than 1 % of the ids random weights sample would have text to stream).
set -euo pipefail
cd "$(dirname "$0")/.."
clients=256 duration=60 rounds=2 device=cpu build=build json="" server_args=()
while (($#)); do
  case $1 in
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --) shift; server_args=("$@"); break ;;
    *) echo "load_test.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#server_args[@]})) || server_args=(--model tests/data/llama_tiny)
gpulab=$build/src/cli/gpulab
[[ -x $gpulab ]] || { echo "load_test.sh: $gpulab not built (scripts/build.sh)" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp /tmp/gpulab_serve_XXXX.log)
"$gpulab" serve --device "$device" --port "$port" "${server_args[@]}" 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$log"; echo "load_test.sh: serve exited early" >&2; exit 1; }
  sleep 0.5
done
echo "load_test.sh: serve pid $pid on port $port ($device, ${server_args[*]}); $clients clients for $duration s"
status=0
python3 tests/load/serve_load.py --port "$port" --clients "$clients" --duration "$duration" --rounds "$rounds" \
  --sigterm-pid $pid ${json:+--json "$json"} || status=1
code=0
wait $pid || code=$?
trap - EXIT
echo "load_test.sh: serve exited with $code after SIGTERM"
tail -3 "$log"
rm -f "$log"
[[ $code == 0 ]] || status=1
exit $status
