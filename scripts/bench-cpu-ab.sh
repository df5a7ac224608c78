#!/usr/bin/env bash
# bench-cpu-ab.sh A_DIR B_DIR: CPU per check of two source trees' regional
# nodes, and of their redis-servers, under the same load.
#
# Builds cmd/regional from each tree (cmd/loadgen from this one), starts
# for each a redis-server and a node on CPU 0, as scripts/bench-regional.sh
# does (same Envoy rules, same flags), and drives them from CPU 1 with
# cmd/loadgen, one at a time, A and B in turn within each round (A first
# in odd rounds). Prints per run the user + system CPU (from
# /proc/PID/stat) of the node and of redis-server per check (a check is
# one descriptor: a 10-descriptor request is 10), the EVALSHA calls per
# request (INFO commandstats), decisions per second and p50; then per
# workload the medians and the median of the B/A ratios taken round by
# round.
#
# CPU per check does not depend on how busy the machine is the way
# throughput does, so this compares two trees on a shared machine; the
# throughput ratios of bench-regional.sh need a quiet one.
#
#   git worktree add /tmp/old 7a156b2
#   scripts/bench-cpu-ab.sh /tmp/old .
#
# Environment: BENCH_DURATION (default 4s) and BENCH_WARMUP (1s) per run;
# BENCH_ROUNDS (default 3); BENCH_RUNS, a list of c50 (50 callers, 10,000
# uniform subjects), z50 (the same, Zipf 1.1), d10 (50 callers, 10
# descriptors per request) and c1 (one caller); default "c50 d10 c1".
set -euo pipefail
if [ $# -ne 2 ] || [ ! -d "$1" ] || [ ! -d "$2" ]; then
	echo "usage: bench-cpu-ab.sh A_DIR B_DIR (two source trees of this module)" >&2
	exit 2
fi
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
cd "$(dirname "$0")/.."

DUR=${BENCH_DURATION:-4s}
WARM=${BENCH_WARMUP:-1s}
ROUNDS=${BENCH_ROUNDS:-3}
RUNS=${BENCH_RUNS:-c50 d10 c1}
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "bench-cpu-ab: BENCH_ROUNDS must be a positive integer" >&2; exit 1 ;; esac
if [ "$ROUNDS" -gt 20 ]; then
	echo "bench-cpu-ab: BENCH_ROUNDS $ROUNDS is more than 20" >&2
	exit 1
fi
for w in $RUNS; do
	case $w in c50 | z50 | d10 | c1) ;; *) echo "bench-cpu-ab: unknown run $w (want c50, z50, d10 or c1)" >&2; exit 1 ;; esac
done

BENCH_NAME=bench-cpu-ab
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
need redis-server "apt-get install redis-server"
need redis-cli "apt-get install redis-tools"
need taskset "apt-get install util-linux"
need go "https://go.dev/dl"
if [ "$(nproc)" -lt 2 ]; then
	echo "bench-cpu-ab: needs 2 CPUs (node and Redis on one, the load on the other); found $(nproc)" >&2
	exit 1
fi
secs "$DUR" >/dev/null
secs "$WARM" >/dev/null

echo "building ..."
(cd "$A" && go build -o "$work/A.regional" ./cmd/regional)
(cd "$B" && go build -o "$work/B.regional" ./cmd/regional)
go build -o "$work/loadgen" ./cmd/loadgen

# The Envoy rules of bench-regional.sh: one descriptor key per position.
envoy_bench_rules >"$work/bench.yaml"

declare -A rport gport node_pid redis_pid
for v in A B; do
	rport[$v]=$(free_port)
	taskset -c 0 redis-server --bind 127.0.0.1 --port "${rport[$v]}" --save '' --appendonly no \
		--dir "$work" --logfile "$work/redis.$v.log" &
	pids+=($!)
	redis_pid[$v]=$!
	for _ in $(seq 1 100); do
		redis-cli -p "${rport[$v]}" ping >/dev/null 2>&1 && break
		sleep 0.05
	done
	redis-cli -p "${rport[$v]}" ping >/dev/null
	gport[$v]=$(free_port)
	taskset -c 0 "$work/$v.regional" -region bench -grpc-addr "127.0.0.1:${gport[$v]}" -http-addr "127.0.0.1:$(free_port)" \
		-redis "127.0.0.1:${rport[$v]}" -policies "$work/bench.yaml" -store-timeout 250ms -log-level warn \
		>"$work/regional.$v.log" 2>&1 &
	pids+=($!)
	node_pid[$v]=$!
	ok=0
	for _ in $(seq 1 200); do
		if "$work/loadgen" -addr "127.0.0.1:${gport[$v]}" -c 1 -n 1 -timeout 200ms >/dev/null 2>&1; then
			ok=1
			break
		fi
		sleep 0.05
	done
	if [ "$ok" = 0 ]; then
		echo "bench-cpu-ab: node $v does not answer" >&2
		cat "$work/regional.$v.log" >&2
		exit 1
	fi
done

HZ=$(getconf CLK_TCK)
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
evalshas() { redis-cli -p "$1" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p'; }
field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$1"; }

# measure V ARGS...: one run against node V; prints node and redis CPU per
# check (µs), EVALSHA calls per request, decisions/s and p50 (µs).
measure() {
	local v=$1
	shift
	local per=1 a0 b0 e0 a1 b1 e1
	case " $* " in *" -descriptors 10 "*) per=10 ;; esac
	taskset -c 1 "$work/loadgen" -addr "127.0.0.1:${gport[$v]}" -warmup "$WARM" -duration "$DUR" -json "$@" >"$work/run.json" &
	local lp=$!
	sleep "$(secs "$WARM")"
	a0=$(ticks "${node_pid[$v]}") b0=$(ticks "${redis_pid[$v]}") e0=$(evalshas "${rport[$v]}")
	wait "$lp"
	a1=$(ticks "${node_pid[$v]}") b1=$(ticks "${redis_pid[$v]}") e1=$(evalshas "${rport[$v]}")
	awk -v hz="$HZ" -v n="$(field "$work/run.json" requests)" -v k="$per" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v e=$((e1 - e0)) \
		-v d="$(field "$work/run.json" decisions_per_s)" -v p="$(field "$work/run.json" p50_ns)" \
		'BEGIN { if (n <= 0) n = 1; printf "%.2f %.2f %.4f %.0f %.0f\n", a * 1e6 / hz / n / k, b * 1e6 / hz / n / k, e / n, d, p / 1000 }'
}

: >"$work/results"
printf '%-6s %-4s %-2s %9s %9s %12s %8s %8s\n' round run - "node µs" "redis µs" "evalsha/req" "dec/s" "p50 µs"
for r in $(seq 1 "$ROUNDS"); do
	for w in $RUNS; do
		case $w in
		c50) args=(-c 50 -subjects 10000) ;;
		z50) args=(-c 50 -subjects 10000 -zipf 1.1) ;;
		d10) args=(-c 50 -subjects 10000 -descriptors 10) ;;
		c1) args=(-c 1 -subjects 10000) ;;
		esac
		order="A B"
		if [ $((r % 2)) = 0 ]; then order="B A"; fi
		for v in $order; do
			set -- $(measure "$v" "${args[@]}")
			echo "$r $w $v $*" >>"$work/results"
			printf '%-6s %-4s %-2s %9s %9s %12s %8s %8s\n' "$r" "$w" "$v" "$1" "$2" "$3" "$4" "$5"
		done
	done
done

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
r3() { awk '{ printf "%.3f", $1 }'; }
# col W V I: column I (4: node, 5: redis, 6: evalsha/req, 7: dec/s, 8: p50) of run W, tree V.
col() { awk -v w="$1" -v v="$2" -v i="$3" '$2 == w && $3 == v { print $i }' "$work/results"; }
# ratios W I: B/A of column I, round by round.
ratios() {
	awk -v w="$1" -v i="$2" '$2 == w { x[$1 " " $3] = $i; r[$1] = 1 }
		END { for (k in r) if (x[k " A"] > 0) print x[k " B"] / x[k " A"] }' "$work/results"
}
echo
echo "medians over $ROUNDS rounds (A: $A, B: $B); B/A is the median of the ratios of each round"
for w in $RUNS; do
	printf '%-4s node %s -> %s us/check (B/A %s), redis %s -> %s us/check (B/A %s), evalsha/req %s -> %s, dec/s %s -> %s, p50 %s -> %s us\n' "$w" \
		"$(col "$w" A 4 | median)" "$(col "$w" B 4 | median)" "$(ratios "$w" 4 | median | r3)" \
		"$(col "$w" A 5 | median)" "$(col "$w" B 5 | median)" "$(ratios "$w" 5 | median | r3)" \
		"$(col "$w" A 6 | median)" "$(col "$w" B 6 | median)" \
		"$(col "$w" A 7 | median)" "$(col "$w" B 7 | median)" \
		"$(col "$w" A 8 | median)" "$(col "$w" B 8 | median)"
done
