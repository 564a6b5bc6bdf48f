#!/usr/bin/env bash
# Runs every fuzz target for N executions (default 1,000,000) and prints a
# Markdown table of the executions each ran and its result. Minimizing a
# new input is bounded to 10 s: some targets (broker's) make a network
# round trip per execution, and Go's default of 60 s per input adds up.
# Usage: scripts/fuzz-all.sh [N] [target-regexp]
set -u
cd "$(dirname "$0")/.."
n=${1:-1000000}
filter=${2:-.}
echo "| package | target | executions | result |"
echo "|---|---|---|---|"
grep -rn "^func Fuzz" --include=*_test.go . | sed 's/:.*func / /; s/(.*//' | sort | while read -r file target; do
	pkg=$(dirname "$file")
	echo "$pkg $target" | grep -qE "$filter" || continue
	out=$(go test -timeout 0 -run '^$' -fuzz "^${target}\$" -fuzztime "${n}x" -fuzzminimizetime 10s "$pkg" 2>&1)
	code=$?
	execs=$(echo "$out" | grep -oE 'execs: [0-9]+' | tail -1 | grep -oE '[0-9]+')
	result=ok
	[ $code -ne 0 ] && result="FAIL: $(echo "$out" | grep -m1 -E 'Failing input|panic|--- FAIL' )"
	echo "| ${pkg#./} | $target | ${execs:-?} | $result |"
done
