#!/usr/bin/env bash
# bench-bucket.sh: the bucket package's Redis benchmarks against a private
# redis-server, beside redis-benchmark's figure for a bare EVALSHA of the
# same token-bucket script, and the ratio Take@64 / bare EVALSHA
# (target >= 0.75), measured back to back in BENCH_ROUNDS rounds (default
# 3) and judged by the median; BENCH_STRICT=1 exits 1 when the median
# misses. Starts and stops its own redis-server on loopback.
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

rounds=${BENCH_ROUNDS:-3}
case "$rounds" in '' | *[!0-9]* | 0) echo "bench-bucket: BENCH_ROUNDS must be a positive integer" >&2; exit 1 ;; esac
if [ "$rounds" -gt 20 ]; then echo "bench-bucket: BENCH_ROUNDS $rounds is more than 20" >&2; exit 1; fi
go test -c -o "$dir/bucket.test" ./bucket/

echo "== go test -bench Redis (BUCKET_BENCH_REDIS=127.0.0.1:$port)"
(cd bucket && BUCKET_BENCH_REDIS="127.0.0.1:$port" "$dir/bucket.test" -test.run '^$' -test.bench 'Redis' -test.benchtime 3s)
# take64 [unmerged]: Take@64 decisions/s with the store's defaults, or with
# every call a script call of its own (Merge 1, pipelined only).
take64() {
  local name='callers=64'
  [[ ${1:-} == unmerged ]] && name='unmerged/callers=64'
  (cd bucket && BUCKET_BENCH_REDIS="127.0.0.1:$port" "$dir/bucket.test" -test.run '^$' -test.bench "RedisTake/^${name}\$" -test.benchtime 3s) |
    awk -v n="BenchmarkRedisTake/$name-" 'index($1, n) == 1 { for (i=1;i<=NF;i++) if ($(i+1)=="decisions/s") print $i }'
}

echo "== redis-benchmark: bare EVALSHA of the token-bucket script, -c 50 -P 16"
src=$(go run ./bucket/internal/tbscript)
sha=$(redis-cli -p "$port" script load "$src")
# KEYS[1] = a group hash, op, now ('' = Redis TIME), guard (0: no loss
# marker), one parameter set (tb, capacity units, refill units/us, cost
# units, TTL ms, fill units (the capacity), since), then the bucket's set
# (1) and field: the arguments BenchmarkRedisTake sends (capacity 1e6
# tokens, refill 1e5/s, cost 1, TTL 60s, new buckets full, since 0: no key
# version start). The bare run
# writes one field into each of 10,000 groups; BenchmarkRedisTake puts its
# 10,000 subjects into the default 4,096 groups (about 2.4 fields each), so
# the bare figure is if anything the easier one.
one=$(redis-cli -p "$port" EVALSHA "$sha" 1 'rl:v1:{g.0}:p' t '' 0 1 tb 1000000000 0.1 1000 60000 1000000000 0 1 bench)
if [[ $(echo "$one" | grep -cE '^-?[0-9]+$') -ne 5 ]]; then
  echo "bench-bucket: the bare EVALSHA does not reply 5 integers (the instant, then 4 per bucket): $one" >&2
  exit 1
fi
bare() {
  redis-benchmark -p "$port" -c 50 -P 16 -n 400000 -r 10000 -q \
    EVALSHA "$sha" 1 'rl:v1:{g.__rand_int__}:p' t '' 0 1 tb 1000000000 0.1 1000 60000 1000000000 0 1 bench |
    tr '\r' '\n' | grep -v '^$' | tail -1 | awk '{ for (i=1;i<=NF;i++) if ($i ~ /requests/) print $(i-1) }'
}

# The machine may be shared: Take@64 and the bare figure are measured back
# to back in rounds, the ratio taken within each round, and the median
# judged.
echo "== $rounds rounds of Take@64, bare EVALSHA, then Take@64 unmerged, back to back"
: >"$dir/ratios"
for r in $(seq 1 "$rounds"); do
  t=$(take64)
  b=$(bare)
  u=$(take64 unmerged)
  if [[ -z "$t" || -z "$b" || -z "$u" ]]; then
    echo "bench-bucket: round $r: no figure (Take@64 '$t', bare '$b', unmerged '$u')" >&2
    exit 1
  fi
  awk -v r="$r" -v a="$t" -v b="$b" -v u="$u" 'BEGIN { printf "round %d: Take@64 %.0f decisions/s, bare EVALSHA %.0f/s, ratio %.2f (unmerged Take@64 %.0f/s, %.2f)\n", r, a, b, a / b, u, u / b }'
  awk -v a="$t" -v b="$b" 'BEGIN { print a / b }' >>"$dir/ratios"
done
sort -g "$dir/ratios" | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "median ratio Take@64 / bare EVALSHA = %.2f over %d rounds (target >= 0.75)\n", m, NR
  exit (m < 0.75) }' || {
  echo "bench-bucket: Take@64 misses its target" >&2
  if [ "${BENCH_STRICT:-0}" = 1 ]; then exit 1; fi
}
