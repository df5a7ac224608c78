#!/usr/bin/env bash
# bench-regional.sh: the regional node benchmark (issue 3, must-show 4).
#
# Starts redis-server and a regional node (cmd/regional, Envoy rate limit
# service API) pinned to CPU 0, drives them from CPU 1 with cmd/loadgen, and
# measures in the same run the two ceilings: a no-work rate limit service
# (loadgen -serve-noop, on CPU 0) and bare redis-benchmark EVALSHA of the
# token-bucket script (assembled from bucket/lua, loaded with SCRIPT LOAD).
# A third server, the no-work service that sends one PING to the same Redis
# before each answer (loadgen -noop-redis), gives the c=1 latency floor of
# any service that asks Redis once per check.
# Prints a table with the ratios against the targets (issue 18; issue 12's
# floors, 65% and 75%, are printed beside them):
#   c=50, 1 descriptor:   >= 85% of the no-work ceiling
#   c=50, 10 descriptors: >= 100% of bare EVALSHA (descriptor decisions/s)
#   c=1:                  p50 <= 1.3x and p99 <= 1.9x the no-work server's
# and, with node leases on a hot subject (issue 16; one subject of a rule
# with lease: {fraction: 1, ttl: 2s} and a budget no run spends):
#   c=50:                 >= 95% of the no-work ceiling
#   c=1:                  p50 <= 1.1x the no-work server's
#   Redis commands per decision (INFO commandstats over the run) < 0.01
# The machine may be shared, so a ceiling and the runs compared with it are
# measured in rounds, back to back (no-work, node uniform, node Zipf, node
# 10 descriptors, bare EVALSHA, node c=1, no-work c=1, no-work + one Redis
# PING c=1, leased c=50, leased c=1): each ratio is taken
# within a round and the table shows each round's figures and the median
# ratio. Beside each run it prints the CPU time per request of the node,
# redis-server (and the part of it spent running scripts, from INFO
# commandstats) and the no-work servers (from /proc/PID/stat), which shows
# where CPU 0's time goes. Every process it starts is stopped by PID on
# exit.
#
# Environment: BENCH_DURATION (default 5s) and BENCH_WARMUP (1s) per run;
# BENCH_ROUNDS (default 3); BENCH_STRICT=1 exits 1 when a median misses a
# target; BENCH_JSON=FILE also writes every result as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."

DUR=${BENCH_DURATION:-5s}
WARM=${BENCH_WARMUP:-1s}
ROUNDS=${BENCH_ROUNDS:-3}
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "bench-regional: BENCH_ROUNDS must be a positive integer" >&2; exit 1 ;; esac
if [ "$ROUNDS" -gt 20 ]; then
	echo "bench-regional: BENCH_ROUNDS $ROUNDS is more than 20" >&2
	exit 1
fi

BENCH_NAME=bench-regional
# shellcheck source=scripts/lib/bench.sh
. scripts/lib/bench.sh
need redis-server "apt-get install redis-server"
need redis-cli "apt-get install redis-tools"
need redis-benchmark "apt-get install redis-tools"
need taskset "apt-get install util-linux"
need go "https://go.dev/dl"
if [ "$(nproc)" -lt 2 ]; then
	echo "bench-regional: needs 2 CPUs (node and Redis on one, the load on the other); found $(nproc)" >&2
	exit 1
fi

echo "building cmd/regional and cmd/loadgen ..."
go build -o "$work/regional" ./cmd/regional
go build -o "$work/loadgen" ./cmd/loadgen

RP=$(free_port)
taskset -c 0 redis-server --bind 127.0.0.1 --port "$RP" --save '' --appendonly no \
	--dir "$work" --logfile "$work/redis.log" &
pids+=($!)
redis_pid=$!
for _ in $(seq 1 100); do
	redis-cli -p "$RP" ping >/dev/null 2>&1 && break
	sleep 0.05
done
redis-cli -p "$RP" ping >/dev/null

# An Envoy rate limit service configuration: one descriptor key per
# descriptor position, 100 requests per second per subject.
mkdir "$work/policies"
envoy_bench_rules >"$work/policies/bench.yaml"
# One rule with node leases for the hot-subject runs: a budget of 10^8 per
# second that no run spends, so every check is decided from the lease.
cat >"$work/policies/lease.yaml" <<'YAML'
domain: benchlease
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 100000000, burst: 100000000, lease: {fraction: 1, ttl: 2s}}
YAML

GP=$(free_port)
HP=$(free_port)
taskset -c 0 "$work/regional" -region bench -grpc-addr "127.0.0.1:$GP" -http-addr "127.0.0.1:$HP" \
	-redis "127.0.0.1:$RP" -policies "$work/policies" -store-timeout 250ms -log-level warn \
	>"$work/regional.log" 2>&1 &
pids+=($!)
node_pid=$!
NP=$(free_port)
taskset -c 0 "$work/loadgen" -serve-noop "127.0.0.1:$NP" >"$work/noop.log" 2>&1 &
pids+=($!)
noop_pid=$!
# The floor of one Redis round trip per check: the no-work service that
# sends one PING to the same redis-server before each answer.
FP=$(free_port)
taskset -c 0 "$work/loadgen" -serve-noop "127.0.0.1:$FP" -noop-redis "127.0.0.1:$RP" >"$work/floor.log" 2>&1 &
pids+=($!)
floor_pid=$!

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
ready "127.0.0.1:$FP"

secs "$DUR" >/dev/null
secs "$WARM" >/dev/null

# ticks PID: user + system CPU clock ticks of a process so far.
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# rcmds: commands redis-server has processed so far.
rcmds() { redis-cli -p "$RP" INFO stats | tr -d '\r' | sed -n 's/^total_commands_processed://p'; }
# rscript: microseconds redis-server has spent running scripts so far
# (EVALSHA's own time, the commands the script calls included).
rscript() { redis-cli -p "$RP" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*,usec=\([0-9]*\),.*/\1/p' | awk '{ s += $1 } END { print s + 0 }'; }
HZ=$(getconf CLK_TCK)

# load NAME ADDR ARGS...: one measured run on CPU 1; its JSON goes to
# $work/NAME.json, and the CPU time per request of the node, redis-server
# (and its script time) and the two no-work servers over the measured part
# to $work/NAME.cpu.
load() {
	local name=$1 addr=$2
	shift 2
	echo "run $name ..."
	local a0 b0 c0 d0 a1 b1 c1 d1 r0 r1 s0 s1
	taskset -c 1 "$work/loadgen" -addr "$addr" -warmup "$WARM" -duration "$DUR" -json "$@" >"$work/$name.json" &
	local lp=$!
	sleep "$(secs "$WARM")"
	a0=$(ticks "$node_pid") b0=$(ticks "$redis_pid") c0=$(ticks "$noop_pid") d0=$(ticks "$floor_pid") r0=$(rcmds) s0=$(rscript)
	wait "$lp"
	a1=$(ticks "$node_pid") b1=$(ticks "$redis_pid") c1=$(ticks "$noop_pid") d1=$(ticks "$floor_pid") r1=$(rcmds) s1=$(rscript)
	# Redis commands per decision (the four INFO calls that measure the run
	# included).
	awk -v n="$(field "$name" requests)" -v r=$((r1 - r0)) 'BEGIN { if (n > 0) printf "%.5f", r / n; else print "0" }' >"$work/$name.rcmd"
	awk -v hz="$HZ" -v n="$(field "$name" requests)" -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v c=$((c1 - c0)) -v d=$((d1 - d0)) -v s=$((s1 - s0)) \
		'BEGIN { if (n > 0) printf "node %.1fus redis %.1fus (scripts %.1fus) no-work %.1fus ping %.1fus", a * 1e6 / hz / n, b * 1e6 / hz / n, s / n, c * 1e6 / hz / n, d * 1e6 / hz / n }' >"$work/$name.cpu"
	if [ -n "${BENCH_JSON:-}" ]; then
		jq -c --arg run "$name" '. + {run: $run}' "$work/$name.json" >>"$BENCH_JSON" 2>/dev/null ||
			sed "s/^{/{\"run\":\"$name\",/" "$work/$name.json" >>"$BENCH_JSON"
	fi
}
field() { sed -n "s/.*\"$2\":\([-0-9.e+]*\).*/\1/p" "$work/$1.json"; }

# Bare EVALSHA of the token-bucket script as the node calls it for one
# bucket (the script text comes from the bucket package itself): take,
# Redis TIME, guard 0 (no loss marker), one parameter set: 'tb', capacity
# 100 tokens (units of 1/1000), refill 100/s (0.1 units per microsecond),
# cost 1 token, idle TTL 60 s, a new bucket filled to its capacity, since
# 0; then the bucket's set (1) and its field 'bench' of a group hash.
SHA=$(go run ./bucket/internal/tbscript | redis-cli -p "$RP" -x SCRIPT LOAD)
one=$(redis-cli -p "$RP" EVALSHA "$SHA" 1 'rl:v1:{g.0}:bench' t '' 0 1 tb 100000 0.1 1000 60000 100000 0 1 bench)
# The reply is the instant, then four integers per bucket
# (bucket/lua/take.lua).
if [ "$(printf '%s\n' "$one" | grep -cE '^-?[0-9]+$')" -ne 5 ]; then
	echo "bench-regional: the bare EVALSHA does not reply 5 integers: $one" >&2
	exit 1
fi
evalsha() {
	echo "run redis-benchmark EVALSHA ..."
	taskset -c 1 redis-benchmark -h 127.0.0.1 -p "$RP" -c 50 -P 16 -n 600000 -r 10000 --csv \
		EVALSHA "$SHA" 1 'rl:v1:{g.__rand_int__}:bench' t '' 0 1 tb 100000 0.1 1000 60000 100000 0 1 bench |
		awk -F'","' 'NR==2 {print $2}' | tr -d '"' >"$work/evalsha.$1"
}

for r in $(seq 1 "$ROUNDS"); do
	echo "round $r of $ROUNDS"
	load "noop-c50.$r" "127.0.0.1:$NP" -c 50 -subjects 10000
	load "node-c50.$r" "127.0.0.1:$GP" -c 50 -subjects 10000
	load "node-c50-zipf.$r" "127.0.0.1:$GP" -c 50 -subjects 10000 -zipf 1.1
	load "node-c50-d10.$r" "127.0.0.1:$GP" -c 50 -subjects 10000 -descriptors 10
	evalsha "$r"
	load "node-c1.$r" "127.0.0.1:$GP" -c 1 -subjects 10000
	load "noop-c1.$r" "127.0.0.1:$NP" -c 1 -subjects 10000
	load "ping-c1.$r" "127.0.0.1:$FP" -c 1 -subjects 10000
	load "lease-c50.$r" "127.0.0.1:$GP" -c 50 -subjects 1 -domain benchlease
	load "lease-c1.$r" "127.0.0.1:$GP" -c 1 -subjects 1 -domain benchlease
done

miss=0
row() { printf '%-36s %12s %9s %9s   %s\n' "$@"; }
us() { awk -v n="$1" 'BEGIN { printf "%.0fus", n / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1f", 100 * a / b; else print "0" }'; }
times() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "999" }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
verdict() { # verdict OK? text
	if [ "$1" = 1 ]; then echo "PASS $2"; else
		miss=1
		echo "MISS $2"
	fi
}
ge() { awk -v a="$1" -v b="$2" 'BEGIN { print (a >= b) ? 1 : 0 }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { print (a <= b) ? 1 : 0 }'; }
floor() { if [ "$(ge "$1" "$2")" = 1 ]; then echo held; else echo missed; fi; }
run() { # run NAME.R LABEL NOTE: one row of the table
	row "$2" "$(printf '%.0f' "$(field "$1" decisions_per_s)")" "$(us "$(field "$1" p50_ns)")" "$(us "$(field "$1" p99_ns)")" "$3 | CPU/req $(cat "$work/$1.cpu")"
}

echo
echo "regional node benchmark: node + redis-server on CPU 0, load on CPU 1, ${DUR} per run after ${WARM} warmup, $ROUNDS rounds"
echo "load average before the table: $(cut -d' ' -f1-3 /proc/loadavg)"
row "run" "decisions/s" "p50" "p99" "within its round"
: >"$work/r50" >"$work/rz" >"$work/r10" >"$work/p50" >"$work/p99" >"$work/x50" >"$work/x99" >"$work/f50" >"$work/nf50" >"$work/l50" >"$work/lx50" >"$work/lrc"
for r in $(seq 1 "$ROUNDS"); do
	NOOP=$(field "noop-c50.$r" decisions_per_s)
	EVAL=$(cat "$work/evalsha.$r")
	r50=$(ratio "$(field "node-c50.$r" decisions_per_s)" "$NOOP")
	rz=$(ratio "$(field "node-c50-zipf.$r" decisions_per_s)" "$NOOP")
	r10=$(ratio "$(field "node-c50-d10.$r" decisions_per_s)" "$EVAL")
	echo "$r50" >>"$work/r50"
	echo "$rz" >>"$work/rz"
	echo "$r10" >>"$work/r10"
	field "node-c1.$r" p50_ns >>"$work/p50"
	field "node-c1.$r" p99_ns >>"$work/p99"
	x50=$(times "$(field "node-c1.$r" p50_ns)" "$(field "noop-c1.$r" p50_ns)")
	x99=$(times "$(field "node-c1.$r" p99_ns)" "$(field "noop-c1.$r" p99_ns)")
	echo "$x50" >>"$work/x50"
	echo "$x99" >>"$work/x99"
	times "$(field "ping-c1.$r" p50_ns)" "$(field "noop-c1.$r" p50_ns)" >>"$work/f50"
	echo >>"$work/f50"
	times "$(field "node-c1.$r" p50_ns)" "$(field "ping-c1.$r" p50_ns)" >>"$work/nf50"
	echo >>"$work/nf50"
	l50=$(ratio "$(field "lease-c50.$r" decisions_per_s)" "$NOOP")
	lx50=$(times "$(field "lease-c1.$r" p50_ns)" "$(field "noop-c1.$r" p50_ns)")
	lrc=$(printf '%s\n%s\n' "$(cat "$work/lease-c50.$r.rcmd")" "$(cat "$work/lease-c1.$r.rcmd")" | sort -g | tail -1)
	echo "$l50" >>"$work/l50"
	echo "$lx50" >>"$work/lx50"
	echo "$lrc" >>"$work/lrc"
	echo "round $r"
	run "noop-c50.$r" "no-work RLS, c=50, 1 descriptor" "ceiling"
	run "node-c50.$r" "node, c=50, uniform 10k subjects" "${r50}% of no-work"
	run "node-c50-zipf.$r" "node, c=50, zipf 1.1 10k subjects" "${rz}% of no-work, over_limit $(field "node-c50-zipf.$r" over_limit)"
	run "node-c50-d10.$r" "node, c=50, 10 descriptors" "${r10}% of bare EVALSHA"
	row "redis-benchmark EVALSHA -c50 -P16" "$(printf '%.0f' "$EVAL")" "-" "-" "ceiling"
	run "node-c1.$r" "node, c=1" "p50 ${x50}x, p99 ${x99}x no-work"
	run "noop-c1.$r" "no-work RLS, c=1" "latency floor of the loopback gRPC hop"
	run "ping-c1.$r" "no-work + one Redis PING, c=1" "p50 $(times "$(field "ping-c1.$r" p50_ns)" "$(field "noop-c1.$r" p50_ns)")x no-work: floor of one Redis round trip per check"
	run "lease-c50.$r" "node lease, c=50, 1 hot subject" "${l50}% of no-work, redis cmds/decision $(cat "$work/lease-c50.$r.rcmd"), over_limit $(field "lease-c50.$r" over_limit)"
	run "lease-c1.$r" "node lease, c=1, 1 hot subject" "p50 ${lx50}x no-work, redis cmds/decision $(cat "$work/lease-c1.$r.rcmd")"
done
m50=$(median <"$work/r50")
m10=$(median <"$work/r10")
mp50=$(median <"$work/p50")
mp99=$(median <"$work/p99")
mx50=$(median <"$work/x50")
mx99=$(median <"$work/x99")
echo "medians over $ROUNDS rounds:"
echo "  c=50 uniform:    $(verdict "$(ge "$m50" 85)" "${m50}% of no-work (target >= 85%; issue 12's floor 65%: $(floor "$m50" 65))")"
echo "  c=50 zipf 1.1:   $(median <"$work/rz")% of no-work"
echo "  10 descriptors:  $(verdict "$(ge "$m10" 100)" "${m10}% of bare EVALSHA (target >= 100%; issue 12's floor 75%: $(floor "$m10" 75))")"
echo "  c=1:             $(verdict "$(le "$mx50" 1.3)" "p50 $(us "$mp50"), ${mx50}x no-work <= 1.3x"); $(verdict "$(le "$mx99" 1.9)" "p99 $(us "$mp99"), ${mx99}x no-work <= 1.9x")"
ml50=$(median <"$work/l50")
mlx50=$(median <"$work/lx50")
mlrc=$(median <"$work/lrc")
echo "  c=1 floor:       one Redis PING per check: p50 $(median <"$work/f50")x no-work; the node's p50 is $(median <"$work/nf50")x this floor's"
echo "  leased c=50:     $(verdict "$(ge "$ml50" 95)" "${ml50}% of no-work (target >= 95%)")"
echo "  leased c=1:      $(verdict "$(le "$mlx50" 1.1)" "p50 ${mlx50}x no-work <= 1.1x")"
echo "  leased redis:    $(verdict "$(awk -v a="$mlrc" 'BEGIN { print (a < 0.01) ? 1 : 0 }')" "${mlrc} commands per decision (the larger of c=50 and c=1; target < 0.01)")"
errs=0
for f in "$work"/*.json; do
	errs=$((errs + $(sed -n 's/.*"errors":\([0-9]*\).*/\1/p' "$f")))
done
if [ "$errs" -gt 0 ]; then
	echo "errors during the runs: $errs (see first_error in the JSON)"
	miss=1
fi
if [ "$miss" = 1 ] && [ "${BENCH_STRICT:-0}" = 1 ]; then
	exit 1
fi
