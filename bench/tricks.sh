#!/usr/bin/env bash
# A/B of the compiler-shaped code (issue 18): each trick is compiled out by
# a build tag, and its cost is compared with the default build (every trick
# in) by alternating the builds, so that a shared machine's drift falls on
# both alike. Take figures on a QUIET machine only (uptime: load < 0.5).
#
#   bash bench/tricks.sh micro [ROUNDS]   # the package benchmarks, ≈ 3 min with 5 rounds
#   bash bench/tricks.sh e2e [ROUNDS]     # cidproxy end to end under ../shared/bench/run.sh, ≈ 20 s per run:
#                                         # 5 builds × ROUNDS runs (6 rounds ≈ 11 min)
#   TRICKS="default ppv2 none" bash bench/tricks.sh e2e 4   # only these builds
#   RATES=25000,50000 bash bench/tricks.sh e2e              # offered rates (default 25000,50000,100000)
#
# Builds ("default" has every trick; "none" has none; the others lack one):
#   addr      -tags purego                  internal/addr reads netip.Addr's words through unsafe
#   ppv2      -tags cidroute_plain_ppv2     pointer arguments and //go:noinline in the PPv2 encoder
#   dtls      -tags cidroute_plain_dtls     dtls.Classify's second copy of the record checks
#
# Results: bench/out/tricks-<mode>-<time>/, summarised at the end by
# go run ./bench/tricks (a trick stays where it saves ≥ 1 % CPU per
# datagram at some rate end to end).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
rounds=${2:-6}
case "$mode" in micro | e2e) ;; *) sed -n '2,24p' "$0"; exit 2 ;; esac
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive number"; exit 2; }

declare -A tags=(
	[default]=""
	[addr]="purego"
	[ppv2]="cidroute_plain_ppv2"
	[dtls]="cidroute_plain_dtls"
	[none]="purego,cidroute_plain_ppv2,cidroute_plain_dtls"
)
read -r -a variants <<<"${TRICKS:-default addr ppv2 dtls none}"
for v in "${variants[@]}"; do
	[[ -v "tags[$v]" ]] || { echo "unknown build $v"; exit 2; }
done
[[ " ${variants[*]} " == *" default "* ]] || variants=(default "${variants[@]}")

out="bench/out/tricks-$mode-$(date +%Y%m%d-%H%M%S)"
bins="$out/bin"
mkdir -p "$bins"
echo "== $(uptime)" | tee "$out/uptime.txt"
echo "== $(go version), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), results in $out"

# order returns the builds for a round: forwards on odd rounds, backwards on
# even ones, so that no build always runs first or last.
order() {
	if (($1 % 2)); then
		printf '%s\n' "${variants[@]}"
	else
		printf '%s\n' "${variants[@]}" | tac
	fi
}

if [[ $mode == micro ]]; then
	pkgs=(. ./ppv2 ./hrw ./dtls ./registry)
	declare -A bench=([.]='^Benchmark(Route|Reverse)$' [./ppv2]='^BenchmarkAppend(Header|Proxy)$' [./hrw]='^BenchmarkPickAddrs$'
		[./dtls]='^BenchmarkClassify$' [./registry]='^Benchmark(IsBackend|PickNewAddrs)$')
	# The builds that change each package's code: the others would only
	# measure the machine's noise.
	declare -A touches=([.]='addr dispatch ppv2 hrw dtls none' [./ppv2]='addr ppv2 none' [./hrw]='addr hrw none'
		[./dtls]='dtls none' [./registry]='addr hrw none')
	name() { basename "$(realpath "$1")"; }
	for v in "${variants[@]}"; do
		for p in "${pkgs[@]}"; do
			go test -c -tags "${tags[$v]}" -o "$bins/$v.$(name "$p").test" "$p"
		done
	done
	# Package by package, the builds back to back, so that each comparison
	# is taken within seconds.
	for r in $(seq "$rounds"); do
		for p in "${pkgs[@]}"; do
			for v in $(order "$r"); do
				[[ $v == default || " ${touches[$p]} " == *" $v "* ]] || continue
				(cd "$p" && "$OLDPWD/$bins/$v.$(name .).test" -test.run '^$' -test.bench "${bench[$p]}" \
					-test.benchtime 500000x) | grep '^Benchmark' >>"$out/$r-$v.txt"
			done
		done
		echo "round $r done"
	done
	echo "== $(uptime)" | tee -a "$out/uptime.txt"
	go run ./bench/tricks -micro "$out" | tee "$out/summary.txt"
	exit 0
fi

shared=$(realpath ../shared/bench/run.sh)
for v in "${variants[@]}"; do
	go build -tags "${tags[$v]}" -o "$bins/cidproxy-$v" ./examples/cidproxy
done
for r in $(seq "$rounds"); do
	for v in $(order "$r"); do
		echo "== round $r/$rounds: $v"
		BENCH_OUT="$(realpath "$out")/$r-$v" "$shared" -reps 1 -only cidproxy,nullfwd \
			-rates "${RATES:-25000,50000,100000}" -many 64 -many-n 1 -cidproxy "$(realpath "$bins/cidproxy-$v")" \
			>"$out/$r-$v.log" 2>&1 || { echo "run failed: $out/$r-$v.log"; exit 1; }
	done
done
echo "== $(uptime)" | tee -a "$out/uptime.txt"
go run ./bench/tricks -e2e "$out" | tee "$out/summary.txt"
