#!/usr/bin/env bash
# bench-rlqs.sh: the regional node's Rate Limit Quota Service under N
# Envoy-faithful clients (issue 16, must-show 2, RLQS part).
#
# Starts redis-server and a regional node with -rlqs pinned to CPU 0, and
# drives it from CPU 1 with cmd/loadgen -rlqs: BENCH_STREAMS clients, one
# stream each, every one using BENCH_BUCKETS bucket ids (shared, so the node
# splits each bucket's rate among all the streams) and reporting usage
# every second. Each round measures the streams held at the end and the
# usage reports handled per second of the node's CPU (from
# /proc/PID/stat over the measured part); the table shows every round and
# the medians. With BENCH_STORE=memory the node uses its in-process store
# instead of Redis (no Redis round trip per lease). Every process it starts
# is stopped by PID on exit; each round is bounded by BENCH_TIMEOUT.
#
# Environment: BENCH_STREAMS (default 500), BENCH_BUCKETS (10),
# BENCH_RATE (requests per bucket per second per client, 10),
# BENCH_DURATION (5s) and BENCH_WARMUP (3s) per round, BENCH_ROUNDS (3),
# BENCH_TIMEOUT (seconds, 300), BENCH_JSON=FILE appends each round's JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMS=${BENCH_STREAMS:-500}
BUCKETS=${BENCH_BUCKETS:-10}
RATE=${BENCH_RATE:-10}
DUR=${BENCH_DURATION:-5s}
WARM=${BENCH_WARMUP:-3s}
ROUNDS=${BENCH_ROUNDS:-3}
STORE=${BENCH_STORE:-redis}
TIMEOUT=${BENCH_TIMEOUT:-300}
for v in STREAMS BUCKETS ROUNDS TIMEOUT; do
	case "${!v}" in '' | *[!0-9]* | 0) echo "bench-rlqs: BENCH_$v must be a positive integer" >&2; exit 1 ;; esac
done
if [ "$ROUNDS" -gt 20 ]; then
	echo "bench-rlqs: BENCH_ROUNDS $ROUNDS is more than 20" >&2
	exit 1
fi
case "$STORE" in redis | memory) ;; *) echo "bench-rlqs: BENCH_STORE must be redis or memory" >&2; exit 1 ;; esac

BENCH_NAME=bench-rlqs
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
[ "$STORE" = memory ] || need redis-server "apt-get install redis-server"
[ "$STORE" = memory ] || need redis-cli "apt-get install redis-tools"
need taskset "apt-get install util-linux"
need timeout "apt-get install coreutils"
need go "https://go.dev/dl"
if [ "$(nproc)" -lt 2 ]; then
	echo "bench-rlqs: needs 2 CPUs (node and Redis on one, the clients on the other); found $(nproc)" >&2
	exit 1
fi

echo "building cmd/regional and cmd/loadgen ..."
go build -o "$work/regional" ./cmd/regional
go build -o "$work/loadgen" ./cmd/loadgen

store_args=()
if [ "$STORE" = redis ]; then
	RP=$(free_port)
	taskset -c 0 redis-server --bind 127.0.0.1 --port "$RP" --save '' --appendonly no \
		--dir "$work" --logfile "$work/redis.log" &
	pids+=($!)
	for _ in $(seq 1 100); do
		redis-cli -p "$RP" ping >/dev/null 2>&1 && break
		sleep 0.05
	done
	redis-cli -p "$RP" ping >/dev/null
	store_args=(-redis "127.0.0.1:$RP")
fi

# Leasable tenants: 1000 requests per second, bursts of 1000.
printf 'domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000, burst: 1000}\n' >"$work/bench.yaml"

GP=$(free_port)
HP=$(free_port)
taskset -c 0 "$work/regional" -region bench -grpc-addr "127.0.0.1:$GP" -http-addr "127.0.0.1:$HP" \
	"${store_args[@]}" -policies "$work/bench.yaml" -rlqs -log-level warn >"$work/regional.log" 2>&1 &
pids+=($!)
node_pid=$!
for _ in $(seq 1 200); do
	"$work/loadgen" -addr "127.0.0.1:$GP" -domain bench -c 1 -n 1 -timeout 200ms >/dev/null 2>&1 && break
	sleep 0.05
done
"$work/loadgen" -addr "127.0.0.1:$GP" -domain bench -c 1 -n 1 -timeout 500ms >/dev/null || {
	echo "bench-rlqs: the node does not answer on 127.0.0.1:$GP" >&2
	cat "$work/regional.log" >&2
	exit 1
}

field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$work/$1.json"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for r in $(seq 1 "$ROUNDS"); do
	echo "round $r of $ROUNDS: $STREAMS streams × $BUCKETS buckets ..."
	timeout "$TIMEOUT" taskset -c 1 "$work/loadgen" -rlqs -addr "127.0.0.1:$GP" -domain bench -key tenant -streams "$STREAMS" \
		-buckets "$BUCKETS" -rate "$RATE" -warmup "$WARM" -duration "$DUR" -node-pid "$node_pid" -json >"$work/rlqs.$r.json"
	if [ -n "${BENCH_JSON:-}" ]; then
		sed "s/^{/{\"run\":\"rlqs.$r\",/" "$work/rlqs.$r.json" >>"$BENCH_JSON"
	fi
done

printf '\n%-8s %8s %8s %12s %12s %22s\n' round streams held "reports/s" "node CPU" "reports/node CPU-s"
for r in $(seq 1 "$ROUNDS"); do
	printf '%-8s %8s %8s %12.0f %11.3fs %22.0f\n' "$r" "$STREAMS" "$(field "rlqs.$r" streams_held)" \
		"$(field "rlqs.$r" reports_per_s)" "$(awk -v n="$(field "rlqs.$r" node_cpu_ns)" 'BEGIN { print n / 1e9 }')" \
		"$(field "rlqs.$r" reports_per_node_cpu_s)"
done
held=$(for r in $(seq 1 "$ROUNDS"); do field "rlqs.$r" streams_held; done | median)
per=$(for r in $(seq 1 "$ROUNDS"); do field "rlqs.$r" reports_per_node_cpu_s; done | median)
rate=$(for r in $(seq 1 "$ROUNDS"); do field "rlqs.$r" reports_per_s; done | median)
printf '\nRLQS: streams held %s of %s, %.0f reports per second, %.0f reports per second per node CPU-second (store %s, medians of %s rounds)\n' \
	"$held" "$STREAMS" "$rate" "$per" "$STORE" "$ROUNDS"
