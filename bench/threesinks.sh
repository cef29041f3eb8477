#!/usr/bin/env bash
# The raw limit with cidproxy's backend topology: a diagnostic for issue 20's
# p99 target. The independent benchmark (../shared/bench) gives cidproxy three
# echo sinks and its raw limit nullfwd one, all on the load generator's CPU.
# This copies that benchmark to a temporary directory, applies
# threesinks.patch (nullfwd -b3: the backend picked by CID byte 0 mod 3 from
# one unconnected upstream socket; target nullfwd-3s with three -ppv2 sinks)
# and runs cidproxy, nullfwd and nullfwd-3s alternated. Nothing in
# ../shared/bench is changed.
#   bash bench/threesinks.sh            # ≈ 2.5 min
#   bash bench/threesinks.sh -reps 9    # flags go to benchctl
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${INDEPENDENT_BENCH:-$root/../shared/bench}
[[ -x $src/run.sh ]] || { echo "threesinks: no independent benchmark at $src (set INDEPENDENT_BENCH)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/bench"
chmod -R u+w "$work/bench"
rm -rf "$work/bench/bin" "$work/bench/results"
(cd "$work/bench" && git apply "$root/bench/threesinks.patch")
(cd "$root" && go build -o "$work/cidproxy" ./examples/cidproxy)
out=${BENCH_OUT:-$root/bench/out/threesinks}
mkdir -p "$out"
BENCH_OUT=$out "$work/bench/run.sh" -only cidproxy,nullfwd,nullfwd-3s -rates 25000,50000,100000 -reps 5 -many 0 -cidproxy "$work/cidproxy" "$@"
awk '/^## RSS/{exit} /^## |^\| (target|nullfwd|cidproxy)/' "$out/summary.md"
