#!/usr/bin/env bash
# Bytes per idle device: three lwm2m-server processes behind two cidproxy
# processes, and the fleet's devices in a third kind of process, so that
# each one's resident memory can be read apart. The devices register and
# then sleep (lifetime 1 h, the first update after half of it), and the
# fleet prints every process's RSS before the devices started and with
# them registered.
#   examples/fleet/memory.sh 10000
set -euo pipefail
n=${1:-1000}
hold=${HOLD:-60s}
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
(cd "$repo/examples" && go build -o "$tmp/" ./fleet ./lwm2m-server ./cidproxy)
psk=$(printf 'cidroute fleet key' | od -An -tx1 | tr -d ' \n')
backends=
for i in 0 1 2; do
	"$tmp/lwm2m-server" -ordinal $i -listen 127.0.0.1:$((5710 + i)) -psk "$psk" -direct drop \
		-http 127.0.0.1:$((9710 + i)) -log-level warn &
	pids+=($!)
	backends+="${backends:+,}{\"ordinal\": $i, \"address\": \"127.0.0.1:$((5710 + i))\", \"state\": \"ready\"}"
done
for i in 0 1; do
	cat >"$tmp/proxy-$i.json" <<JSON
{"hrw_seed": 42, "log_level": "warn", "services": [{"name": "lwm2m", "protocol": "dtls",
 "listen": "127.0.0.1:$((5720 + i))", "cid_length": 8, "workers": 1, "backends": [$backends],
 "health_check": {"interval": "500ms", "timeout": "450ms", "fall": 3, "rise": 2}}]}
JSON
	"$tmp/cidproxy" -config "$tmp/proxy-$i.json" &
	pids+=($!)
done
sleep 3
"$tmp/fleet" -devices "$n" -lifetime 1h -duration "$hold" -progress 15s \
	-connect 127.0.0.1:5720,127.0.0.1:5721 \
	-server-stats http://127.0.0.1:9710/stats,http://127.0.0.1:9711/stats,http://127.0.0.1:9712/stats \
	-rss-pids "$(IFS=,; echo "${pids[*]}")"
