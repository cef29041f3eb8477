#!/usr/bin/env bash
# Tests the backend adapters against the oldest and the newest release of
# the library each adapts: dtls/piondtls with github.com/pion/dtls/v3,
# quic/quicgo with github.com/quic-go/quic-go. The oldest is the adapter's
# own go.mod requirement (what a user gets at least); the newest is the
# newest release the local Go can build (its go line not above this Go's).
# Each run is a copy of the repository with the workspace off, so that no
# other module raises the version. Only the adapter's packages are tested.
#   scripts/minmax.sh            # both adapters, oldest and newest
#   scripts/minmax.sh piondtls   # one adapter
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export GOWORK=off GOTOOLCHAIN=local GOFLAGS="-mod=mod -buildvcs=false"
timeout=${MINMAX_TEST_TIMEOUT:-5m}

adapters=("dtls/piondtls github.com/pion/dtls/v3" "quic/quicgo github.com/quic-go/quic-go")
want=${1:-}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
local_go=$(go env GOVERSION | sed 's/^go//')

# newest DEP: the newest listed release whose go line this Go can build.
newest() {
	local dep=$1 v gomod line
	for v in $(go list -m -versions "$dep" | tr ' ' '\n' | tail -n +2 | grep -v -- - | sort -rV); do
		gomod=$(go mod download -json "$dep@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
		line=$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod" | head -1)
		if [ -z "$line" ] || [ "$(printf '%s\n%s\n' "$line" "$local_go" | sort -V | tail -1)" = "$local_go" ]; then
			echo "$v"
			return
		fi
		echo "minmax: $dep $v needs go $line, newer than this go $local_go; trying older" >&2
	done
	echo "minmax: no release of $dep builds with go $local_go" >&2
	return 1
}

fail=0
for a in "${adapters[@]}"; do
	read -r dir dep <<<"$a"
	case "$want" in "" | "$(basename "$dir")" | "$dir") ;; *) continue ;; esac
	oldest=$(cd "$repo/$dir" && go list -m -f '{{.Version}}' "$dep")
	req=$(cd "$repo/$dir" && go mod edit -json | grep -A1 "\"Path\": \"$dep\"" | sed -n 's/.*"Version": "\(.*\)".*/\1/p')
	if [ "$oldest" != "$req" ]; then
		echo "minmax: $dir requires $dep $req but its build list selects $oldest: another requirement raises it"
		fail=1
	fi
	latest=$(newest "$dep")
	for v in "$oldest" "$latest"; do
		copy="$tmp/$(basename "$dir")-$v"
		mkdir -p "$copy"
		(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$copy"
		cd "$copy/$dir"
		go get "$dep@$v" >/dev/null 2>&1 || { echo "minmax: go get $dep@$v failed"; go get "$dep@$v"; fail=1; continue; }
		got=$(go list -m -f '{{.Version}}' "$dep")
		start=$(date +%s)
		if go test -count=1 -timeout "$timeout" ./... >"$copy.log" 2>&1; then
			echo "ok   $dir with $dep $got ($(( $(date +%s) - start )) s)"
		else
			echo "FAIL $dir with $dep $got:"
			tail -40 "$copy.log"
			fail=1
		fi
		cd "$repo"
		rm -rf "$copy"
	done
done
exit $fail
