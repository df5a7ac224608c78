#!/usr/bin/env bash
# syscalls-per-check.sh TEST_BINARY BENCH_REGEX N: system calls per check
# of one sub-benchmark of BenchmarkOneCaller, by kind.
#
# Runs the test binary (go test -c -o X ./internal/regional/) twice under
# perf stat, with -test.benchtime Nx and 2Nx at -test.cpu 1, and prints
# per kind (2N count - N count) / N: setup, warm-up and the process's
# start cancel out, so what is left is what one more check costs in the
# whole process, every thread counted (the runtime's sysmon and idle
# threads too). read, write and recvfrom follow the check's own work;
# epoll_pwait, futex, nanosleep and sched_yield follow the scheduler's
# timing and the machine's load, and move from run to run (run it several
# times). Needs perf with the syscalls tracepoints, and REDIS_ADDR:
#
#   go test -c -o /tmp/regional.test ./internal/regional/
#   scripts/with-redis.sh scripts/syscalls-per-check.sh /tmp/regional.test 'OneCaller/handler$' 3000
set -euo pipefail
if [ $# -ne 3 ] || [ ! -x "$1" ]; then
	echo "usage: syscalls-per-check.sh TEST_BINARY BENCH_REGEX N" >&2
	exit 2
fi
bin=$1 re=$2 n=$3
case "$n" in '' | *[!0-9]* | 0) echo "syscalls-per-check: N must be a positive integer" >&2; exit 2 ;; esac
command -v perf >/dev/null || { echo "syscalls-per-check: perf not found; install it (apt-get install linux-perf)" >&2; exit 1; }
[ -n "${REDIS_ADDR:-}" ] || { echo "syscalls-per-check: REDIS_ADDR is not set; run under scripts/with-redis.sh" >&2; exit 1; }

kinds="read write recvfrom epoll_pwait futex nanosleep sched_yield"
events=raw_syscalls:sys_enter
for k in $kinds; do events="$events,syscalls:sys_enter_$k"; done

# count N prints "event count" lines of one run of N checks.
count() {
	perf stat -x, -e "$events" "$bin" -test.run '^$' -test.bench "$re" -test.cpu 1 \
		-test.benchtime "${1}x" 2>&1 >/dev/null | awk -F, 'NF > 3 && $1 ~ /^[0-9]+$/ {print $3, $1}'
}
one=$(count "$n")
two=$(count $((2 * n)))
join <(sort <<<"$one") <(sort <<<"$two") | awk -v n="$n" '{
	k = $1; sub(/^raw_syscalls:sys_enter$/, "all", k); sub(/^syscalls:sys_enter_/, "", k)
	printf "%-12s %6.2f\n", k, ($3 - $2) / n
}' | sort -k1,1
