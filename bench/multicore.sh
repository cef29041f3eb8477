#!/usr/bin/env bash
# How cidproxy scales from 1 to 2 workers (issue 20): nothing pinned, so
# the proxy, examples/loadgen and three examples/echo backends share every
# CPU, as on a host that serves with all its cores. For each rate, the
# runs alternate 1 and 2 workers ROUNDS times; each prints round trips/s,
# loss, p99 and the proxy's CPU per datagram (its user + system time over
# loadgen's window / 2 × replies).
#
#   bash bench/multicore.sh [ROUNDS] [RATES]   # defaults 2 and "100000 150000" (0 = flat out, where
#                                             # loadgen's 256 sockets take the CPUs); ≈ 1 min
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
read -r -a rates <<<"${2:-100000 150000}"
bin=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$bin"' EXIT
go build -o "$bin/" ./examples/cidproxy ./examples/loadgen ./examples/echo
echo "== $(uptime)"
for i in 0 1 2; do "$bin/echo" -listen "127.0.0.1:1982$i" >/dev/null 2>&1 & done
for rate in "${rates[@]}"; do
	for r in $(seq "$rounds"); do
		for w in 1 2; do
			cat >"$bin/cfg.json" <<JSON
{"log_level": "warn", "services": [{"name": "b", "protocol": "dtls", "listen": "127.0.0.1:19800", "workers": $w,
 "backends": [{"ordinal": 0, "address": "127.0.0.1:19820"}, {"ordinal": 1, "address": "127.0.0.1:19821"}, {"ordinal": 2, "address": "127.0.0.1:19822"}]}]}
JSON
			"$bin/cidproxy" -config "$bin/cfg.json" >/dev/null 2>&1 &
			p=$!
			sleep 0.5
			out=$("$bin/loadgen" -target 127.0.0.1:19800 -clients 256 -sockets 256 -ordinals 0-2 -rate "$rate" -duration 4s -watch-pid $p -json)
			kill $p
			wait $p 2>/dev/null || true
			python3 - "$out" "$w" "$rate" "$r" <<'PY'
import json, sys
o = json.loads(sys.argv[1]); w = o["watch"]
cpu = w["user_s"] + w["system_s"]
print(f"rate {sys.argv[3]:>6} round {sys.argv[4]} workers {sys.argv[2]}: {o['received_pps']:9.0f} round trips/s, "
      f"loss {100*o['loss_ratio']:5.2f} %, p99 {o['rtt_us']['p99']:8.0f} µs, proxy CPU {cpu/o['window_s']:.2f}, "
      f"{cpu*1e6/(2*max(1, o['received'])):.2f} µs per datagram")
PY
		done
	done
done
echo "== $(uptime)"
