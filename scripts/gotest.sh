#!/usr/bin/env bash
# go test with its arguments, its output shown as it comes, and then, when
# it failed, the failed tests and packages once more, last: CI keeps only
# the tail of a long run's output, where a failure's name was otherwise
# lost among the logs that follow it.
#
# Usage: gotest.sh [go test flags] -- packages
#
# The packages in GOTEST_SHARD ("./internal/pipeline:3 ./cmd/cdc:2" by
# default) are the slow ones: each of their processes runs its tests one
# after another, and they mostly wait on Postgres and Kafka. Unless the
# flags select tests themselves (-run), each of those packages runs in that
# many processes side by side, its tests split between them by the weights
# in scripts/test-weights.txt (seconds a test took, longest first), so that
# each process gets about as much; every process starts its own Postgres
# (internal/testenv), and topics are named per test. GOTEST_SHARD="" runs
# every package in one go test, as before.
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
flags=() pkgs=()
seen=0
for a in "$@"; do
	if [ "$a" = "--" ]; then seen=1; continue; fi
	if [ $seen = 1 ]; then pkgs+=("$a"); else flags+=("$a"); fi
done
if [ $seen = 0 ]; then pkgs=("${flags[@]: -1}"); flags=("${flags[@]:0:${#flags[@]}-1}"); fi

dir=$(mktemp -d -t cdc-gotest-XXXXXX)
trap 'rm -rf "$dir"' EXIT
shard=${GOTEST_SHARD-./internal/pipeline:3 ./cmd/cdc:2}
for f in "${flags[@]}"; do
	case "$f" in -run|-run=*|-bench|-bench=*|-fuzz|-fuzz=*) shard="" ;; esac
done

# The build flags (-race, -tags) a test list must be made with.
build=()
for ((i = 0; i < ${#flags[@]}; i++)); do
	case "${flags[$i]}" in
	-race) build+=(-race) ;;
	-tags) build+=(-tags "${flags[$((i + 1))]}") ;;
	-tags=*) build+=("${flags[$i]}") ;;
	esac
done

all=$("$GO" list "${build[@]}" "${pkgs[@]}") || exit 1
declare -A parts
for s in $shard; do
	pkg=$("$GO" list "${s%%:*}") || exit 1
	if grep -qx "$pkg" <<<"$all"; then parts[$pkg]=${s##*:}; fi
done
rest=()
for p in $all; do [ -n "${parts[$p]:-}" ] || rest+=("$p"); done

# Each test's time is kept (scripts/testjson.py, which prints what go test
# prints without -v): the slowest are listed at the end, and
# GOTEST_WEIGHTS=FILE writes the sharded packages' times there, as
# scripts/test-weights.txt holds them. Not for -v or benchmarks, whose
# output is wanted whole.
json=1
for f in "${flags[@]}"; do
	case "$f" in -v|-v=*|-bench|-bench=*|-json) json=0 ;; esac
done

# run NAME ARGS...: go test ARGS, its lines prefixed with NAME, into a log.
pids=()
run() {
	local name=$1
	shift
	if [ "$json" = 1 ]; then
		("$GO" test -json "${flags[@]}" "$@" 2>&1 | python3 scripts/testjson.py "$dir/$name.times"; echo "gotest-exit: ${PIPESTATUS[0]}") | sed -u "s|^|[$name] |" | tee "$dir/$name.log" &
	else
		("$GO" test "${flags[@]}" "$@" 2>&1; echo "gotest-exit: $?") | sed -u "s|^|[$name] |" | tee "$dir/$name.log" &
	fi
	pids+=($!)
}
[ ${#rest[@]} = 0 ] || run all "${rest[@]}"
for pkg in "${!parts[@]}"; do
	n=${parts[$pkg]}
	short=${pkg##*/}
	"$GO" test "${build[@]}" -short -list '^(Test|Fuzz|Example)' "$pkg" | grep -E '^(Test|Fuzz|Example)' >"$dir/$short.tests" || { echo "gotest: cannot list the tests of $pkg" >&2; exit 1; }
	# Longest first, each to the process with the least so far.
	assigned=$(python3 - "$n" scripts/test-weights.txt "$dir/$short.tests" <<'EOF'
import sys
n, weights = int(sys.argv[1]), {}
try:
    for line in open(sys.argv[2]):
        f = line.split()
        if len(f) == 2:
            weights[f[0]] = float(f[1])
except FileNotFoundError:
    pass
tests = [t for t in open(sys.argv[3]).read().split() if t]
tests.sort(key=lambda t: -weights.get(t, 5.0))
load, shards = [0.0] * n, [[] for _ in range(n)]
for t in tests:
    i = load.index(min(load))
    shards[i].append(t)
    load[i] += weights.get(t, 5.0)
for s in shards:
    print("|".join(s))
EOF
)
	i=0
	while IFS= read -r names; do
		i=$((i + 1))
		[ -n "$names" ] && run "$short-$i" -run "^($names)\$" "$pkg"
	done <<<"$assigned"
done

rc=0
for p in "${pids[@]}"; do wait "$p"; done
if compgen -G "$dir/*.times" >/dev/null; then
	echo "gotest: the slowest tests (seconds):"
	sort -k3 -rn "$dir"/*.times | head -20 | awk '{printf "gotest:   %7.1f  %s %s\n", $3, $2, $1}'
	if [ -n "${GOTEST_WEIGHTS:-}" ]; then
		{
			echo "# Seconds each test of the packages scripts/gotest.sh splits took (go test -race, 2 cores; GOTEST_WEIGHTS=FILE make test writes them): its weights. Refresh when they drift."
			for pkg in "${!parts[@]}"; do awk -v p="$pkg" '$1 == p {print $2, $3}' "$dir"/*.times; done | sort
		} >"$GOTEST_WEIGHTS"
	fi
fi
grep -h "gotest-exit: [1-9]" "$dir"/*.log >/dev/null && rc=1
if [ "$rc" != 0 ]; then
	echo "gotest: failed:"
	grep -hE '^\[[^]]*\] (\s*--- FAIL|\s+[A-Za-z0-9_.]+\.go:[0-9]+: |FAIL|panic:|.*\[build failed\]|# )' "$dir"/*.log | head -80 | sed 's/^/gotest:   /'
fi
exit "$rc"
