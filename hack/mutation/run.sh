#!/usr/bin/env bash
# Mutation testing with gremlins, one package at a time, each within a time
# budget; prints efficacy (killed / (killed + lived)) per package.
#
#   hack/mutation/run.sh [pkg ...]        default: the core packages
#   MUTATION_BUDGET=40m                   per package (coreutils timeout)
#   MUTATION_DIFF=<git ref>               only mutants on lines changed since ref
#   MUTATION_OUT=results-mutation         JSON results and logs
#   MUTATION_EXCLUDE="re1 re2"            file regexps to leave out (replaces
#                                         the exclude-files of gremlins.yaml)
#   MUTATION_TIMEOUT_COEF=5               a mutant's tests may take this many
#                                         times the unmutated run (TIMED OUT)
#
# Tests run with -short (through GOFLAGS): the trimmed property tests still
# kill what the full ones kill, at a fraction of the time per mutant.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
version=v0.6.0
bin="$root/.cache/bin/gremlins-$version"
if [ ! -x "$bin" ]; then
	echo "installing gremlins $version into .cache/bin" >&2
	tmp=$(mktemp -d)
	GOBIN="$tmp" GOFLAGS= go install "github.com/go-gremlins/gremlins/cmd/gremlins@$version"
	mkdir -p "$root/.cache/bin"
	mv "$tmp/gremlins" "$bin"
	rmdir "$tmp"
fi
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(blockkeys kvindex applier kvevents indexer api prefixstore tokenization)
budget=${MUTATION_BUDGET:-40m}
out=${MUTATION_OUT:-$root/results-mutation}
mkdir -p "$out"
export GOFLAGS="${GOFLAGS:-} -short -count=1" # -count=1: a cached coverage run would make the per-mutant timeout tiny
args=(unleash --config "$root/hack/mutation/gremlins.yaml")
[ -z "${MUTATION_TIMEOUT_COEF:-}" ] || args+=(--timeout-coefficient "$MUTATION_TIMEOUT_COEF")
if [ -n "${MUTATION_DIFF:-}" ]; then
	args+=(--diff "$MUTATION_DIFF")
	# gremlins names files relative to the package it runs in but reads
	# repository-relative paths from git diff: make git print them relative
	export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=diff.relative GIT_CONFIG_VALUE_0=true
fi
for re in ${MUTATION_EXCLUDE:-}; do
	args+=(--exclude-files "$re")
done
status=0
summary=()
for p in "${pkgs[@]}"; do
	p=${p#./}
	p=${p%/...}
	p=${p%/}
	name=${p//\//_}
	if [ -n "${MUTATION_DIFF:-}" ] && ! git diff --name-only "$MUTATION_DIFF" -- "$p" | grep -v '_test\.go$' | grep -q '\.go$'; then
		summary+=("$(printf '%-14s no non-test Go change since %.12s' "$p" "$MUTATION_DIFF")")
		continue
	fi
	echo "== $p (budget $budget)" >&2
	start=$(date +%s)
	rc=0
	(cd "$p" && timeout "$budget" "$bin" "${args[@]}" --output "$out/$name.json") >"$out/$name.log" 2>&1 || rc=$?
	secs=$(( $(date +%s) - start ))
	grep -E "LIVED|TIMED OUT" "$out/$name.log" >&2 || true
	if [ $rc -eq 124 ]; then
		summary+=("$(printf '%-14s budget of %s used up after %ds: no figure' "$p" "$budget" "$secs")")
		status=1
		continue
	fi
	if [ $rc -ne 0 ] || [ ! -s "$out/$name.json" ]; then
		summary+=("$(printf '%-14s gremlins failed (exit %d), see %s' "$p" "$rc" "$out/$name.log")")
		status=1
		continue
	fi
	summary+=("$(python3 - "$out/$name.json" "$p" "$secs" <<'PY'
import collections, json, sys
d = json.load(open(sys.argv[1]))
n = collections.Counter(m["status"] for f in d.get("files") or [] for m in f["mutations"])
k, l = n["KILLED"], n["LIVED"]
eff = 100.0 * k / (k + l) if k + l else 100.0
print("%-14s efficacy %5.1f%%  killed %4d  lived %3d  timed out %3d  not covered %3d  %5ds" % (
    sys.argv[2], eff, k, l, n["TIMED OUT"], n["NOT COVERED"], int(sys.argv[3])))
PY
)")
done
echo
printf '%s\n' "${summary[@]}"
exit $status
