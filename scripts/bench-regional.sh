#!/usr/bin/env bash
# bench-regional.sh: the regional node benchmark (issue 3, must-show 4).
#
# Starts redis-server and a regional node (cmd/regional, Envoy rate limit
# service API) pinned to CPU 0, drives them from CPU 1 with cmd/loadgen, and
# measures in the same run the two ceilings: a no-work rate limit service
# (loadgen -serve-noop, on CPU 0) and bare redis-benchmark EVALSHA of the
# token-bucket script (assembled from bucket/lua, loaded with SCRIPT LOAD).
# Prints a table with the ratios against the targets:
#   c=50, 1 descriptor:   >= 65% of the no-work ceiling
#   c=50, 10 descriptors: >= 75% of bare EVALSHA (descriptor decisions/s)
#   c=1:                  p50 < 250us, p99 < 700us
# Every process it starts is stopped by PID on exit.
#
# Environment: BENCH_DURATION (default 8s) and BENCH_WARMUP (2s) per run;
# BENCH_STRICT=1 exits 1 when a target is missed; BENCH_JSON=FILE also
# writes every result as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."

DUR=${BENCH_DURATION:-8s}
WARM=${BENCH_WARMUP:-2s}

need() {
	command -v "$1" >/dev/null 2>&1 || {
		echo "bench-regional: $1 not found; install it ($2)" >&2
		exit 1
	}
}
need redis-server "apt-get install redis-server"
need redis-cli "apt-get install redis-tools"
need redis-benchmark "apt-get install redis-tools"
need taskset "apt-get install util-linux"
need go "https://go.dev/dl"
if [ "$(nproc)" -lt 2 ]; then
	echo "bench-regional: needs 2 CPUs (node and Redis on one, the load on the other); found $(nproc)" >&2
	exit 1
fi

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a loopback TCP port nothing listens on.
free_port() {
	local p
	for _ in $(seq 1 100); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "bench-regional: no free port" >&2
	exit 1
}

echo "building cmd/regional and cmd/loadgen ..."
go build -o "$work/regional" ./cmd/regional
go build -o "$work/loadgen" ./cmd/loadgen

RP=$(free_port)
taskset -c 0 redis-server --bind 127.0.0.1 --port "$RP" --save '' --appendonly no \
	--dir "$work" --logfile "$work/redis.log" &
pids+=($!)
for _ in $(seq 1 100); do
	redis-cli -p "$RP" ping >/dev/null 2>&1 && break
	sleep 0.05
done
redis-cli -p "$RP" ping >/dev/null

# An Envoy rate limit service configuration: one descriptor key per
# descriptor position, 100 requests per second per subject.
{
	echo "domain: bench"
	echo "descriptors:"
	for k in tenant tenant0 tenant1 tenant2 tenant3 tenant4 tenant5 tenant6 tenant7 tenant8 tenant9; do
		printf '  - key: %s\n    rate_limit:\n      unit: second\n      requests_per_unit: 100\n' "$k"
	done
} >"$work/bench.yaml"

GP=$(free_port)
HP=$(free_port)
taskset -c 0 "$work/regional" -region bench -grpc-addr "127.0.0.1:$GP" -http-addr "127.0.0.1:$HP" \
	-redis "127.0.0.1:$RP" -policies "$work/bench.yaml" -store-timeout 250ms -log-level warn \
	>"$work/regional.log" 2>&1 &
pids+=($!)
NP=$(free_port)
taskset -c 0 "$work/loadgen" -serve-noop "127.0.0.1:$NP" >"$work/noop.log" 2>&1 &
pids+=($!)

ready() {
	for _ in $(seq 1 200); do
		"$work/loadgen" -addr "$1" -c 1 -n 1 -timeout 200ms >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "bench-regional: nothing answers on $1" >&2
	cat "$work/regional.log" >&2
	exit 1
}
ready "127.0.0.1:$GP"
ready "127.0.0.1:$NP"

# load NAME ADDR ARGS...: one measured run on CPU 1; prints its JSON to $work/NAME.json.
load() {
	local name=$1 addr=$2
	shift 2
	echo "run $name ..."
	taskset -c 1 "$work/loadgen" -addr "$addr" -warmup "$WARM" -duration "$DUR" -json "$@" >"$work/$name.json"
	if [ -n "${BENCH_JSON:-}" ]; then
		jq -c --arg run "$name" '. + {run: $run}' "$work/$name.json" >>"$BENCH_JSON" 2>/dev/null ||
			sed "s/^{/{\"run\":\"$name\",/" "$work/$name.json" >>"$BENCH_JSON"
	fi
}
field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$work/$1.json"; }

load noop-c50 "127.0.0.1:$NP" -c 50 -subjects 10000
load node-c50 "127.0.0.1:$GP" -c 50 -subjects 10000
load node-c50-zipf "127.0.0.1:$GP" -c 50 -subjects 10000 -zipf 1.1
load node-c1 "127.0.0.1:$GP" -c 1 -subjects 10000
load node-c50-d10 "127.0.0.1:$GP" -c 50 -subjects 10000 -descriptors 10

# Bare EVALSHA of the token-bucket script as the node calls it for one
# bucket (the script text comes from the bucket package itself): take,
# Redis TIME, 'tb', capacity 100 tokens (units of 1/1000), refill 100/s
# (0.1 units per microsecond), cost 1 token, idle TTL 60 s, field 'bench'
# of a group hash.
echo "run redis-benchmark EVALSHA ..."
SHA=$(go run ./bucket/internal/tbscript | redis-cli -p "$RP" -x SCRIPT LOAD)
one=$(redis-cli -p "$RP" EVALSHA "$SHA" 1 'rl:v1:{g.0}:bench' t '' tb 100000 0.1 1000 60000 bench)
if [ "$(printf '%s\n' "$one" | grep -cE '^-?[0-9]+$')" -ne 5 ]; then
	echo "bench-regional: the bare EVALSHA does not reply 5 integers: $one" >&2
	exit 1
fi
EVAL=$(taskset -c 1 redis-benchmark -h 127.0.0.1 -p "$RP" -c 50 -P 16 -n 1000000 -r 10000 --csv \
	EVALSHA "$SHA" 1 'rl:v1:{g.__rand_int__}:bench' t '' tb 100000 0.1 1000 60000 bench |
	awk -F'","' 'NR==2 {print $2}')
EVAL=${EVAL//\"/}

NOOP=$(field noop-c50 decisions_per_s)
N50=$(field node-c50 decisions_per_s)
NZ=$(field node-c50-zipf decisions_per_s)
N1=$(field node-c1 decisions_per_s)
N1P50=$(field node-c1 p50_ns)
N1P99=$(field node-c1 p99_ns)
N10=$(field node-c50-d10 decisions_per_s)

miss=0
row() { printf '%-34s %12s %10s %10s   %s\n' "$@"; }
us() { awk -v n="$1" 'BEGIN { printf "%.0fus", n / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "0" }'; }
verdict() { # verdict OK? text
	if [ "$1" = 1 ]; then echo "PASS $2"; else
		miss=1
		echo "MISS $2"
	fi
}
ge() { awk -v a="$1" -v b="$2" 'BEGIN { print (a >= b) ? 1 : 0 }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { print (a < b) ? 1 : 0 }'; }

r50=$(ratio "$N50" "$NOOP")
rz=$(ratio "$NZ" "$NOOP")
r10=$(ratio "$N10" "$EVAL")
echo
echo "regional node benchmark: node + redis-server on CPU 0, load on CPU 1, ${DUR} per run after ${WARM} warmup"
row "run" "decisions/s" "p50" "p99" "vs target"
row "no-work RLS, c=50, 1 descriptor" "$(printf '%.0f' "$NOOP")" "$(us "$(field noop-c50 p50_ns)")" "$(us "$(field noop-c50 p99_ns)")" "ceiling"
row "node, c=50, uniform 10k subjects" "$(printf '%.0f' "$N50")" "$(us "$(field node-c50 p50_ns)")" "$(us "$(field node-c50 p99_ns)")" \
	"$(verdict "$(ge "$r50" 65)" "${r50}% of no-work (target >= 65%)")"
row "node, c=50, zipf 1.1 10k subjects" "$(printf '%.0f' "$NZ")" "$(us "$(field node-c50-zipf p50_ns)")" "$(us "$(field node-c50-zipf p99_ns)")" \
	"${rz}% of no-work (over_limit $(field node-c50-zipf over_limit))"
row "node, c=1" "$(printf '%.0f' "$N1")" "$(us "$N1P50")" "$(us "$N1P99")" \
	"$(verdict "$(lt "$N1P50" 250000)" "p50 < 250us"); $(verdict "$(lt "$N1P99" 700000)" "p99 < 700us")"
row "node, c=50, 10 descriptors" "$(printf '%.0f' "$N10")" "$(us "$(field node-c50-d10 p50_ns)")" "$(us "$(field node-c50-d10 p99_ns)")" \
	"$(verdict "$(ge "$r10" 75)" "${r10}% of bare EVALSHA (target >= 75%)")"
row "redis-benchmark EVALSHA -c50 -P16" "$(printf '%.0f' "$EVAL")" "-" "-" "ceiling"
errs=0
for f in noop-c50 node-c50 node-c50-zipf node-c1 node-c50-d10; do
	errs=$((errs + $(field "$f" errors)))
done
if [ "$errs" -gt 0 ]; then
	echo "errors during the runs: $errs (see first_error in the JSON)"
	miss=1
fi
if [ "$miss" = 1 ] && [ "${BENCH_STRICT:-0}" = 1 ]; then
	exit 1
fi
