#!/bin/sh
# bench-debit-vs.sh compares Debit's benchmarks of this working tree (or of a commit)
# with those of a base commit, side by side in one run.
#
#	scripts/bench-debit-vs.sh [-n RUNS] [-t BENCHTIME] [-c GOMAXPROCS] [BASE [NEW]]
#
# BASE defaults to c69352b (the second round's main, before limiting events and
# Update); NEW to the working tree as it is, uncommitted changes included. It builds
# one test binary of each (go test -c; commits are checked out in git worktrees in a
# temporary directory, removed on exit), then runs every benchmark RUNS times
# (default 7), each run a process of its own with -test.benchtime BENCHTIME (default
# 1s) and -test.count 1, the two binaries alternately and in alternating order (base
# then new, new then base, ...), so that both see the same machine. GOMAXPROCS is
# the machine's, as in a user's own benchmark, unless -c sets -test.cpu. Set CPU to a
# processor number to pin every run to it with taskset, and ROWS to a subset of the
# rows below to run only those.
#
# Both sides run the same benchmark code: BenchmarkDebitAPI (debit_api_bench_test.go,
# the exported API only, which every commit since c69352b has) is copied from the
# working tree into each checked-out commit before it is built.
#
# It prints, per benchmark, the fastest ns/op of each side, the ratio new/base of the
# fastest, the median of the pairwise ratios (paired), the fastest cpu-ns/op (the
# process's CPU time per call, which waiting for a CPU does not inflate) of each side
# and their ratio, and the most allocs/op seen on each side. The fastest of several
# runs is the figure least disturbed by other work on a shared machine; the paired
# median shows whether the fastest runs are representative. The raw outputs stay in
# $OUT (default a temporary directory, printed) for benchstat.
#
# Rows (BenchmarkDebitAPI's cases; the base commit has no events, so the events row
# sets new's BenchmarkDebitEvents/hot against base's BenchmarkDebit/hot):
#
#	100k-accounts     100,000 accounts round robin (a table with room for them)
#	full-table-flood  a new spoofed client network per call against a full table
#	hot               one account, over and over
#	hot+events        one account, with an event function set (new side only)
#	100k-accounts-default-table  100,000 accounts round robin in the default table
#	                  (not run unless ROWS names it)
set -eu

runs=7
benchtime=1s
procs=""
while getopts n:t:c: opt; do
	case $opt in
	n) runs=$OPTARG ;;
	t) benchtime=$OPTARG ;;
	c) procs=$OPTARG ;;
	*) echo "usage: $0 [-n RUNS] [-t BENCHTIME] [-c GOMAXPROCS] [BASE [NEW]]" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
base=${1:-c69352b}
new=${2:-}

repo=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-debit-vs.XXXXXX")
out=${OUT:-$tmp}
mkdir -p "$out"
worktrees=""
cleanup() {
	for w in $worktrees; do
		git -C "$repo" worktree remove --force "$w" >/dev/null 2>&1 || true
	done
	if [ "$out" != "$tmp" ]; then rm -rf "$tmp"; else rm -rf "$tmp"/src-* "$tmp"/*.test "$tmp"/last.txt; fi
}
trap cleanup EXIT INT TERM

# build REF NAME builds the test binary of commit REF (or of the working tree, REF
# empty) as $tmp/NAME.test.
build() {
	dir=$repo
	if [ -n "$1" ]; then
		dir=$tmp/src-$2
		git -C "$repo" worktree add --detach "$dir" "$1" >/dev/null 2>&1
		worktrees="$worktrees $dir"
		cp "$repo/debit_api_bench_test.go" "$dir/"
	fi
	(cd "$dir" && go test -c -o "$tmp/$2.test" .)
}
build "$base" base
build "$new" new
if [ -n "$new" ]; then
	newname=$(git -C "$repo" rev-parse --short "$new")
else
	newname="working tree ($(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- || echo ', modified'))"
fi
echo "base $(git -C "$repo" rev-parse --short "$base"), new $newname"
echo "$runs runs each, -test.benchtime $benchtime -test.count 1, GOMAXPROCS ${procs:-$(nproc) (the machine's)}${CPU:+, pinned to CPU $CPU}; raw output in $out"

pin=""
if [ -n "${CPU:-}" ]; then pin="taskset -c $CPU"; fi
cpuflag=""
if [ -n "$procs" ]; then cpuflag="-test.cpu $procs"; fi

# one SIDE ROW BENCH runs one benchmark of one side and appends its result line to
# $out/SIDE.txt, tagged with ROW.
one() {
	$pin "$tmp/$1.test" -test.run '^$' -test.bench "$3" -test.benchtime "$benchtime" \
		-test.count 1 $cpuflag -test.benchmem >"$tmp/last.txt" 2>&1 || {
		cat "$tmp/last.txt" >&2
		exit 1
	}
	grep '^Benchmark' "$tmp/last.txt" | sed "s|^|$2 |" >>"$out/$1.txt"
}

rows=${ROWS:-100k-accounts full-table-flood hot hot+events}
bench() { # bench SIDE ROW prints the -test.bench pattern of ROW on SIDE
	case $2 in
	hot+events) if [ "$1" = new ]; then echo '^BenchmarkDebitEvents$/^hot$'; else echo '^BenchmarkDebit$/^hot$'; fi ;;
	*) echo "^BenchmarkDebitAPI\$/^$2\$" ;;
	esac
}
: >"$out/base.txt"
: >"$out/new.txt"
i=0
while [ $i -lt "$runs" ]; do
	for row in $rows; do
		if [ $((i % 2)) -eq 0 ]; then
			one base "$row" "$(bench base "$row")"
			one new "$row" "$(bench new "$row")"
		else
			one new "$row" "$(bench new "$row")"
			one base "$row" "$(bench base "$row")"
		fi
	done
	i=$((i + 1))
done

# Lines are "ROW BenchmarkName N X ns/op ... Y allocs/op"; the k-th line of a row on
# each side is the k-th run, so pairs are taken in order.
awk '
function field(unit,   j) { for (j = 3; j <= NF; j++) if ($(j) == unit) return $(j-1); return "" }
function median(a, m,   x, y, z) {
	for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (a[y] < a[x]) { z = a[x]; a[x] = a[y]; a[y] = z }
	return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
FNR == 1 { side++ }
{
	row = $1; ns = field("ns/op") + 0; cpu = field("cpu-ns/op"); al = field("allocs/op")
	k = ++n[side, row]; t[side, row, k] = ns
	if (!((side, row) in best) || ns < best[side, row]) best[side, row] = ns
	if (cpu != "" && (!((side, row) in bcpu) || cpu + 0 < bcpu[side, row])) bcpu[side, row] = cpu + 0
	if (al != "" && (!((side, row) in allocs) || al + 0 > allocs[side, row] + 0)) allocs[side, row] = al
	if (side == 1 && !(row in seen)) { seen[row] = 1; order[++rows] = row }
}
END {
	printf "%-18s %11s %11s %9s %8s %9s %11s %10s\n", "benchmark", "base ns/op", "new ns/op", "new/base", "paired", "base cpu", "new cpu", "cpu ratio"
	for (r = 1; r <= rows; r++) {
		row = order[r]; m = n[1, row] < n[2, row] ? n[1, row] : n[2, row]
		delete q
		for (k = 1; k <= m; k++) q[k] = t[2, row, k] / t[1, row, k]
		cr = ((1, row) in bcpu && (2, row) in bcpu) ? sprintf("%.3f", bcpu[2, row] / bcpu[1, row]) : "-"
		c1 = (1, row) in bcpu ? sprintf("%.1f", bcpu[1, row]) : "-"
		c2 = (2, row) in bcpu ? sprintf("%.1f", bcpu[2, row]) : "-"
		printf "%-18s %11.1f %11.1f %9.3f %8.3f %9s %11s %10s   allocs %s/%s\n", row, best[1, row], best[2, row],
			best[2, row] / best[1, row], median(q, m), c1, c2, cr, allocs[1, row], allocs[2, row]
	}
}' "$out/base.txt" "$out/new.txt"
