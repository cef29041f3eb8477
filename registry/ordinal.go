package registry

import "strings"

// OrdinalFromHostname returns the StatefulSet ordinal at the end of a pod
// name or hostname: "ds-2" → 2, "ds-17.dtls-backend.ns.svc" → 17 (the
// domain, after the first dot, is ignored: StatefulSet names are DNS
// labels). The suffix after the last '-' must be a decimal number
// 0–MaxOrdinal without leading zeros: StatefulSets never write them, and
// "ds-02" next to "ds-2" would be two pods claiming one ordinal. This is
// the one parser both sides use: the proxies' Kubernetes source reads
// backends' ordinals with it, and backends read their own, so that a
// backend never claims an ordinal the proxies do not route to it.
func OrdinalFromHostname(name string) (uint8, bool) {
	name, _, _ = strings.Cut(name, ".")
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return 0, false
	}
	s := name[i+1:]
	if len(s) == 0 || len(s) > 3 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > MaxOrdinal {
		return 0, false
	}
	return uint8(n), true
}
