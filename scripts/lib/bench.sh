# Shared by the process benchmarks (scripts/bench-regional.sh,
# scripts/bench-rlqs.sh, scripts/bench-cpu-ab.sh): source it after setting
# BENCH_NAME. It makes a work directory ($work) and a list of started PIDs
# ($pids), every one stopped and waited for on exit, and defines need,
# free_port, secs and envoy_bench_rules.

# need exits with an install hint when the command $1 is missing.
need() {
	command -v "$1" >/dev/null 2>&1 || {
		echo "$BENCH_NAME: $1 not found; install it ($2)" >&2
		exit 1
	}
}

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
	echo "$BENCH_NAME: no free port" >&2
	exit 1
}

# secs D: a duration such as 2s or 500ms in seconds.
secs() {
	case "$1" in
	*ms) awk -v v="${1%ms}" 'BEGIN { print v / 1000 }' ;;
	*s) echo "${1%s}" ;;
	*) echo "$BENCH_NAME: duration $1: want a number of s or ms" >&2; exit 1 ;;
	esac
}

# envoy_bench_rules prints the Envoy rate limit service rules of the node
# benchmarks: domain bench, one descriptor key per descriptor position
# (tenant, tenant0 .. tenant9), 100 requests per second per subject.
envoy_bench_rules() {
	echo "domain: bench"
	echo "descriptors:"
	for k in tenant tenant0 tenant1 tenant2 tenant3 tenant4 tenant5 tenant6 tenant7 tenant8 tenant9; do
		printf '  - key: %s\n    rate_limit:\n      unit: second\n      requests_per_unit: 100\n' "$k"
	done
}
