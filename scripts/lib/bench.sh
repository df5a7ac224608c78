# Shared by the process benchmarks (scripts/bench-regional.sh,
# scripts/bench-rlqs.sh): source it after setting BENCH_NAME. It makes a
# work directory ($work) and a list of started PIDs ($pids), every one
# stopped and waited for on exit, and defines need and free_port.

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
