#!/usr/bin/env bash
# go test with its arguments, its output shown as it comes, and then, when
# it failed, the failed tests and packages once more, last: CI keeps only
# the tail of a long run's output, where a failure's name was otherwise
# lost among the logs that follow it.
set -uo pipefail
log=$(mktemp -t cdc-gotest-XXXXXX)
trap 'rm -f "$log"' EXIT
"${GO:-go}" test "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" != 0 ]; then
	echo "gotest: failed (go test exited $rc):"
	grep -E '^\s*--- FAIL|^\s+[A-Za-z0-9_.]+\.go:[0-9]+: |^FAIL|^panic:|\[build failed\]|^# ' "$log" | sed 's/^/gotest:   /' | head -60
fi
exit "$rc"
