#!/usr/bin/env bash
# Wiring mutants: applies each mutant of hack/mutation/wiring.txt in turn
# (one text replacement in the composition root or the daemon's wiring),
# runs the promise tests it names against the real binary, and fails when
# one survives (its tests pass) or when a listed text no longer occurs
# exactly once (the list went stale). The source is restored after every
# mutant, also on interrupt.
set -euo pipefail
cd "$(dirname "$0")/../.."
list=hack/mutation/wiring.txt
killed=0
lived=()
restore=""
trap '[ -z "$restore" ] || cp "$restore" "$file"' EXIT INT TERM
tmp=$(mktemp -d)
# the unmutated tree must pass the tests the mutants are judged by
re=$(grep -v '^#' "$list" | grep -v '^$' | cut -d'|' -f4 | sed 's/^\^//; s/\$$//' | sort -u | paste -sd'|')
echo "wiring mutants: baseline ($re)" >&2
go test -count=1 -run "^($re)\$" ./internal/promises/ >"$tmp/baseline.log" 2>&1 || {
	cat "$tmp/baseline.log" >&2
	echo "wiring mutants: the unmutated tree fails its promise tests" >&2
	exit 1
}
while IFS='|' read -r file old new tests what; do
	case $file in '' | '#'*) continue ;; esac
	n=$(grep -cF -- "$old" "$file" || true)
	if [ "$n" != 1 ]; then
		echo "wiring mutants: \"$old\" occurs $n times in $file: update $list" >&2
		exit 1
	fi
	cp "$file" "$tmp/orig"
	restore="$tmp/orig"
	OLD="$old" NEW="$new" python3 -c 'import os,sys; p=sys.argv[1]; s=open(p).read(); open(p,"w").write(s.replace(os.environ["OLD"], os.environ["NEW"], 1))' "$file"
	if go test -count=1 -run "$tests" ./internal/promises/ >"$tmp/mutant.log" 2>&1; then
		lived+=("$file: $what")
		echo "LIVED   $file: drops $what" >&2
	else
		killed=$((killed + 1))
		echo "KILLED  $file: drops $what" >&2
	fi
	cp "$tmp/orig" "$file"
	restore=""
done <"$list"
rm -rf "$tmp"
echo "wiring mutants: killed $killed, lived ${#lived[@]}"
[ ${#lived[@]} -eq 0 ]
