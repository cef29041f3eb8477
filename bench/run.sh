#!/usr/bin/env bash
# The forwarding benchmark: cidproxy (1 and 2 workers), the raw-limit and
# naive baselines and nginx's UDP stream proxy, side by side, on loopback.
#
#   bash bench/run.sh           # full run (≈ 10 min): bench/out/, then copied to bench/results/
#   bash bench/run.sh -quick    # validation run (≈ 1.5 min): bench/out/ only
#   bash bench/run.sh -overload # past capacity only (≈ 7 min): bench/out/overload.md, then bench/results/
#
# A full run ends with 3 s CPU profiles of cidproxy (flat out and at
# 50k/s), whose tops go beside the table; -profile 0 skips them.
# Further flags go to the runner (go run ./bench/runner -h). The forwarder
# is pinned to CPU 1, loadgen and the echo backends to CPU 0 (taskset).
# Needs: Go, taskset (util-linux); nginx and libnginx-mod-stream for nginx.
set -euo pipefail
cd "$(dirname "$0")/.."

out=bench/out
mkdir -p "$out/bin"
# Profiles of an earlier run must not pass for this run's.
rm -f "$out"/*.pprof "$out"/*.top.txt
go build -o "$out/bin/" ./examples/loadgen ./examples/echo ./examples/cidproxy ./bench/rawfwd ./bench/naivefwd ./bench/runner
"$out/bin/runner" -bin "$out/bin" -out "$out" -command "bash bench/run.sh $*" "$@"

for a in "$@"; do
	if [ "$a" = -overload ]; then
		mkdir -p bench/results
		cp "$out/overload.md" "$out/overload.json" bench/results/
		echo "bench/run.sh: results in bench/results/overload.md"
		exit 0
	fi
done

# The chart; the plotting library lives in its own module (bench/plot).
(cd bench/plot && go run . -in ../out/results.json -out ../out/chart)

# Top of the CPU profiles, when -profile asked for them.
for p in "$out"/cidproxy-1w-rate*.pprof; do
	[ -e "$p" ] || continue
	go tool pprof -top -nodecount=35 "$out/bin/cidproxy" "$p" >"${p%.pprof}.top.txt" 2>/dev/null || true
done

quick=0
for a in "$@"; do [ "$a" = -quick ] && quick=1; done
if [ "$quick" = 0 ]; then
	mkdir -p bench/results
	rm -f bench/results/*.top.txt
	cp "$out/table.md" "$out/results.json" "$out/chart.svg" "$out/chart.png" bench/results/
	for t in "$out"/*.top.txt; do [ -e "$t" ] && cp "$t" bench/results/; done
	echo "bench/run.sh: results in bench/results/"
else
	echo "bench/run.sh: results in $out/ (quick run: bench/results/ untouched)"
fi
