#!/usr/bin/env bash
# bench-bucket.sh: the bucket package's Redis benchmarks against a private
# redis-server, beside redis-benchmark's figure for a bare EVALSHA of the
# same token-bucket script, and the ratio Take@64 / bare EVALSHA
# (target >= 0.75). Starts and stops its own redis-server on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null || { echo "bench-bucket: redis-server not installed" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "bench-bucket: redis-benchmark not installed" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
dir=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" --daemonize no &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

echo "== go test -bench Redis (BUCKET_BENCH_REDIS=127.0.0.1:$port)"
out=$(BUCKET_BENCH_REDIS="127.0.0.1:$port" go test -run '^$' -bench 'Redis' -benchtime 3s ./bucket/)
echo "$out"
take64=$(echo "$out" | awk '/BenchmarkRedisTake\/callers=64/ { for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i }')

echo "== redis-benchmark: bare EVALSHA of the token-bucket script, -c 50 -P 16"
src=$(go run ./bucket/internal/tbscript)
sha=$(redis-cli -p "$port" script load "$src")
# KEYS[1] = a group hash, op, now ('' = Redis TIME), then tb, capacity units,
# refill units/us, cost units, TTL ms, field: the arguments BenchmarkRedisTake
# sends (capacity 1e6 tokens, refill 1e5/s, cost 1, TTL 60s). The bare run
# writes one field into each of 10,000 groups; BenchmarkRedisTake puts its
# 10,000 subjects into the default 4,096 groups (about 2.4 fields each), so
# the bare figure is if anything the easier one.
one=$(redis-cli -p "$port" EVALSHA "$sha" 1 'rl:v1:{g.0}:p' t '' tb 1000000000 0.1 1000 60000 bench)
if [[ $(echo "$one" | grep -cE '^-?[0-9]+$') -ne 5 ]]; then
  echo "bench-bucket: the bare EVALSHA does not reply 5 integers: $one" >&2
  exit 1
fi
bare=$(redis-benchmark -p "$port" -c 50 -P 16 -n 400000 -r 10000 -q \
  EVALSHA "$sha" 1 'rl:v1:{g.__rand_int__}:p' t '' tb 1000000000 0.1 1000 60000 bench \
  | tr '\r' '\n' | grep -v '^$' | tail -1)
echo "$bare"
bareps=$(echo "$bare" | awk '{ for (i=1;i<=NF;i++) if ($i ~ /requests/) print $(i-1) }')
echo "== Take@64 ${take64:-?} decisions/s, bare EVALSHA ${bareps:-?}/s"
if [[ -n "${take64:-}" && -n "${bareps:-}" ]]; then
  awk -v a="$take64" -v b="$bareps" 'BEGIN { printf "ratio Take@64 / bare EVALSHA = %.2f (target >= 0.75)\n", a / b }'
fi
