//go:build cidroute_plain_hrw

package hrw

import "net/netip"

// sumAddrs is sum64 of the 36-byte key AppendAddr builds for c and s: the
// plain version of sumaddrs.go's.
func sumAddrs(c, s netip.AddrPort, seed uint64) uint64 {
	var k [2 * AddrLen]byte
	return sum64(AppendAddr(AppendAddr(k[:0], c), s), seed)
}
