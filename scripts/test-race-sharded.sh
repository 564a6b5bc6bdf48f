#!/usr/bin/env bash
# The race pass of `make test`: every package but proxy as one `go test
# -p $TESTP`, and proxy's tests split into two shards run beside it.
# proxy's race run (one binary, its tests one after another) was the
# pass's tail: 407-711 s, running alone for minutes after every other
# package had finished.
# Usage: scripts/test-race-sharded.sh <timeout> <packages...>
set -u
timeout=$1
shift
proxy=github.com/infera/infera/proxy
others=()
for p in "$@"; do
	[ "$p" = "$proxy" ] || others+=("$p")
done
names=$(${GO:-go} test -list '.*' "$proxy" | grep -E '^(Test|Fuzz|Example)') || {
	echo "cannot list $proxy's tests" >&2
	exit 1
}
# Alternate names between the shards: neighbours in a file tend to cost
# alike, so each shard gets half of every file's tests.
a=$(echo "$names" | awk 'NR%2==1' | paste -sd'|')
b=$(echo "$names" | awk 'NR%2==0' | paste -sd'|')
if [ -z "$a" ] || [ -z "$b" ]; then
	echo "$proxy: no tests listed" >&2
	exit 1
fi
run() { ${GO:-go} test -count=1 -race -timeout "$timeout" "$@"; }
run -run "^($a)\$" "$proxy" & pa=$!
run -run "^($b)\$" "$proxy" & pb=$!
rc=0
if [ ${#others[@]} -gt 0 ]; then
	# TESTP binaries, the two shards beside them: with one fewer the
	# other packages were the pass's tail (they ended 4 min 53 s after
	# the shards, at a7c5a7a).
	run -p "${TESTP:-3}" "${others[@]}" || rc=1
fi
wait $pa || rc=1
wait $pb || rc=1
exit $rc
