#!/usr/bin/env bash
# The bounded mutation slice CI runs on every build (make mutation-ci):
# every mutant of a fixed list of hot files, within one hard time budget,
# failing when the slice's efficacy drops below a threshold.
#
# Why a fixed list and not "lines changed in the last N commits": the
# slice then costs the same on every run (a merge of a big branch does not
# blow the budget, a docs-only commit does not make it empty), it needs no
# history (shallow clones work), and every survivor in it has been looked
# at, so the threshold can be exact. Changed lines on a branch:
# make mutation-diff.
#
#   MUTATION_CI_FILES   the slice (package-relative .go files); default below
#   MUTATION_CI_BUDGET  hard budget in seconds for everything, installing
#                       gremlins included (default 1500). The kvevents half
#                       took 712 s on an idle 2-core machine once its snapshot
#                       and shared-endpoint tests grew (2026-11-27; 900 s
#                       left the indexer half 175 s, too few).
#   MUTATION_CI_MIN     minimum efficacy in percent, after leaving out the
#                       accepted equivalents of hack/mutation/equivalent.txt
#                       (default 100: every other mutant must be killed)
#   MUTATION_OUT        results (default results-mutation/ci)
#
# Efficacy is killed / (killed + lived) as gremlins counts it: timed-out
# and not-covered mutants are reported, not counted.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$(date +%s)
# The engine's replay client (gap repair and catch-up: what keeps the index
# complete) and the indexer's query normalisation (what every score and pick
# request goes through): 54 mutants, each a rebuild of its package's tests.
files=${MUTATION_CI_FILES:-kvevents/replay.go indexer/query.go}
budget=${MUTATION_CI_BUDGET:-1500}
min=${MUTATION_CI_MIN:-100}
out=${MUTATION_OUT:-$root/results-mutation/ci}
rm -rf "$out"
mkdir -p "$out"

# group the slice by package, keeping the order given
pkgs=()
declare -A keep
for f in $files; do
	[ -f "$f" ] || { echo "mutation-ci: $f does not exist (MUTATION_CI_FILES)" >&2; exit 1; }
	p=$(dirname "$f")
	[ -n "${keep[$p]:-}" ] || pkgs+=("$p")
	keep[$p]="${keep[$p]:-} $(basename "$f")"
done

status=0
for p in "${pkgs[@]}"; do
	# gremlins selects files only by exclusion: exclude every other file of
	# the package (paths are relative to the package directory)
	excl=("/") # subpackages: gremlins walks the whole directory tree
	for f in "$p"/*.go; do
		b=$(basename "$f")
		case " ${keep[$p]} " in *" $b "*) continue ;; esac
		case $b in *_test.go) continue ;; esac
		excl+=("^${b//./\\.}\$")
	done
	left=$((budget - ($(date +%s) - start)))
	if [ "$left" -le 10 ]; then
		echo "mutation-ci: time budget of ${budget}s used up before $p" >&2
		exit 1
	fi
	# a mutant that hangs is given 3x the package's run, not 5x: hung
	# mutants are not counted either way, and they are what costs time.
	# Under heavy load some killable mutants time out too (reported, not
	# counted): the slice is weaker then, never wrongly failed.
	MUTATION_OUT="$out" MUTATION_BUDGET="${left}s" MUTATION_EXCLUDE="${excl[*]}" \
		MUTATION_TIMEOUT_COEF="${MUTATION_TIMEOUT_COEF:-3}" \
		hack/mutation/run.sh "$p" || status=1
done
if [ $status -ne 0 ]; then
	echo "mutation-ci: a package run failed or ran out of time (logs in $out)" >&2
	exit 1
fi

python3 - "$out" "$root/hack/mutation/equivalent.txt" "$min" $((($(date +%s) - start))) "${pkgs[@]}" <<'PY'
import collections, json, os, sys

out, eqfile, minimum, secs, pkgs = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5:]

# equivalent.txt: path|MUTATOR|column in the trimmed line|trimmed line,
# matched on the source text so that edits elsewhere in the file do not
# stale it; a change of the line itself asks for a new look.
equiv = set()
for line in open(eqfile, encoding="utf-8"):
    line = line.rstrip("\n")
    if not line.strip() or line.startswith("#"):
        continue
    path, kind, col, text = line.split("|", 3)
    equiv.add((path, kind, int(col), text))

n = collections.Counter()
gaps = []
for p in pkgs:
    d = json.load(open(os.path.join(out, p.replace("/", "_") + ".json")))
    for f in d.get("files") or []:
        path = p + "/" + f["file_name"]
        src = open(path, encoding="utf-8").read().split("\n")
        for m in f["mutations"]:
            st = m["status"]
            if st == "LIVED":
                raw = src[m["line"] - 1]
                text = raw.lstrip(" \t")
                key = (path, m["type"], m["column"] - (len(raw) - len(text)), text.rstrip())
                if key in equiv:
                    st = "EQUIVALENT"
                else:
                    gaps.append("%s:%d:%d %s   %s" % (path, m["line"], m["column"], m["type"], text.rstrip()))
            n[st] += 1

k, l = n["KILLED"], n["LIVED"]
eff = 100.0 * k / (k + l) if k + l else 100.0
print("mutation-ci: %s" % " ".join(pkgs))
print("  killed %d, lived %d, accepted equivalents %d, timed out %d, not covered %d, not viable %d"
      % (k, l, n["EQUIVALENT"], n["TIMED OUT"], n["NOT COVERED"], n["NOT VIABLE"]))
print("  efficacy without the equivalents %.1f%% (minimum %.1f%%), %ss in all" % (eff, minimum, secs))
for g in gaps:
    print("  LIVED " + g)
if eff < minimum:
    print("mutation-ci: FAIL: kill the mutants above with a test, or list them in "
          "hack/mutation/equivalent.txt (reason in EQUIVALENT.md)")
    sys.exit(1)
PY
