package xdp

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
)

// The rows of README.md's "What runs where" table under which the program
// hands a datagram up (XDP_PASS), as predicates on what the differential
// tests send: a pass anywhere else fails them. The frames the tests build
// are well-formed (checksums, no options or fragments, our MAC), so those
// rows never apply.

const (
	egressMTU  = 1500 // the veth of the test namespace
	maxPayload = 4607 // "a payload over 4607 bytes"
)

// forwardMayPass is the row that lets the program hand a client datagram
// to dst up, or "".
func (e *diffEnv) forwardMayPass(s *diffService, client netip.AddrPort, dst netip.Addr, payload []byte, want outcome) string {
	switch {
	case len(payload) > maxPayload:
		return "a payload over 4607 bytes"
	case client.Addr().Is4() != dst.Is4():
		return "IPv4-mapped addresses on IPv6"
	case e.addrRow(client.Addr(), dst) != "":
		return e.addrRow(client.Addr(), dst)
	case s.Listen.Addr().IsUnspecified() && !e.own.IsHost(dst):
		return "a wildcard service's port at an address not this host's"
	}
	if s.Protocol == cidroute.DTLS && dtlsRecords(payload, s.Codec.Len()) > maxDTLSRecords {
		return "more than 32 DTLS records"
	}
	if s.Protocol == cidroute.QUIC && quicPackets(payload, s.Codec.Len()) > maxQUICPackets {
		return "more than 8 coalesced QUIC packets"
	}
	if s.Protocol == cidroute.DTLS && dtls13Reached(payload, s.Codec.Len()) {
		return "a DTLS 1.3 record where the program's record walk reaches it"
	}
	if s.Protocol == cidroute.DTLS && dtlsFirstCIDMisfits(payload, s.Codec.Len()) {
		return "a first tls12_cid record that does not fit the service's CID length (dtls.MismatchedCID decides)"
	}
	if s.Protocol == cidroute.QUIC && quicRejectedHandshakeOfOtherLen(payload, s.Codec.Len()) {
		return "a rejected QUIC datagram starting with a Handshake packet whose DCID is of another length"
	}
	if !want.backend.IsValid() {
		return ""
	}
	if b := want.backend; e.own.IsHost(b.Addr()) && b != unmap(s.Public) && !e.serviceAt(b) {
		return "a backend at another of this host's addresses (the pipeline's own-address set decides)"
	}
	hdr, ipHdr := ppv2.HeaderLen4, 20
	if !client.Addr().Is4() {
		hdr = ppv2.HeaderLen6
	}
	if !want.backend.Addr().Is4() {
		ipHdr = 40
	}
	if ipHdr+8+hdr+len(payload) > egressMTU {
		return "larger than the egress MTU"
	}
	return ""
}

// kernelRefuses says why the kernel drops a datagram src → dst that
// arrives on the namespace's interface (not loopback) before any socket,
// with rp_filter 0, 1 or 2 and accept_local and route_localnet off (the
// defaults), or "". TestMartiansAsTheKernel checks it against the kernel.
func (e *diffEnv) kernelRefuses(src, dst netip.Addr) string {
	src, dst = src.Unmap(), dst.Unmap()
	if src.Is4() {
		switch a := src.As4(); {
		case src.IsUnspecified(), a[0] == 127, src.IsMulticast(), a == [4]byte{255, 255, 255, 255}:
			return "a martian source (ip_route_input_slow)"
		case dst.IsUnspecified(), dst.IsLoopback():
			return "a martian destination (ip_route_input_slow)"
		case e.ifaddrs[src]:
			return "a source that is one of the host's interface addresses (fib_validate_source)"
		case slices.ContainsFunc(e.nets, func(n netip.Prefix) bool { return n.Contains(src) }):
			return "a source in a local route (fib_validate_source)"
		}
		return ""
	}
	switch {
	case src.IsLoopback() || src.IsMulticast() || dst.IsLoopback():
		return "a loopback or multicast source or a loopback destination (ip6_rcv_core)"
	case dst.IsUnspecified():
		return "an unspecified destination (no local route: not delivered)"
	}
	return ""
}

// addrRow is the row under which the program hands a frame src → dst up
// for its addresses, or "": all the kernel refuses, and more (a host
// address as the source, which IPv6 accepts; an unspecified
// destination).
func (e *diffEnv) addrRow(src, dst netip.Addr) string {
	switch {
	case e.kernelRefuses(src, dst) != "":
		return e.kernelRefuses(src, dst)
	case !plainUnicast(src):
		return "a source the kernel would refuse"
	case e.own.IsHost(src):
		return "a source that is one of this host's addresses"
	case dst.Unmap().IsLoopback(), dst.Unmap().IsUnspecified():
		return "a loopback or unspecified destination"
	}
	return ""
}

// serviceAt reports whether a service of the environment listens at a:
// there, or on its port at a wildcard address.
func (e *diffEnv) serviceAt(a netip.AddrPort) bool {
	for _, s := range e.services {
		l := unmap(s.Listen)
		if l == a || l.Port() == a.Port() && l.Addr().IsUnspecified() && (l.Addr().Is4() == a.Addr().Is4() || !l.Addr().Is4()) {
			return true
		}
	}
	return false
}

// reverseMayPass is the row that lets the program hand a reply up, or "".
func (e *diffEnv) reverseMayPass(s *diffService, b []byte, rep cidroute.Reply) string {
	switch {
	case len(b) > maxPayload:
		return "a payload over 4607 bytes"
	case rep.Reason == cidroute.UntrustedSender:
		return ""
	case hasTLVs(b):
		return "PPv2 TLVs"
	case rep.Reason == cidroute.BadProxyHeader:
		return ""
	}
	h, _, err := ppv2.Parse(b)
	if err != nil {
		return "" // the Router would have said BadProxyHeader
	}
	src, client := unmap(h.Src), unmap(h.Dst)
	if s.measured && (!plainUnicast(src.Addr()) || !e.own.IsHost(src.Addr())) {
		return "a measured service's PPv2 source that is not one of this host's addresses"
	}
	ip, port := client.Addr(), client.Port()
	pub, listen := unmap(s.Public), unmap(s.Listen)
	switch {
	case !ip.IsValid(), port == 0, ip.IsUnspecified(), ip.IsMulticast(), ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "" // no client in any family: the program refuses it too
	case ip.Is4() != pub.Addr().Is4(), s.measured && ip.Is4() != src.Addr().Is4():
		return "a reply whose family the service socket cannot send"
	case ip.IsLoopback():
		if pub.Addr().IsLoopback() {
			return "a client on loopback of a loopback service"
		}
		return ""
	case ip == pub.Addr() || ip == listen.Addr():
		if port == pub.Port() || port == listen.Port() || slices.ContainsFunc(s.Upstreams, func(u netip.AddrPort) bool { return u.Port() == port }) {
			return ""
		}
		return "a client at the service's address on another port"
	case e.own.IsHost(ip):
		return "a client on this host"
	case rep.Reason != cidroute.Forwarded:
		return ""
	case !plainUnicast(ip):
		return "a client address the kernel would refuse as a source (0/8, class E, ::/96)"
	case onLink(ip) && e.nextHop[ip] == nil:
		return "next hop unknown"
	}
	ipHdr := 20
	if !ip.Is4() {
		ipHdr = 40
	}
	if ipHdr+8+len(rep.Payload) > egressMTU {
		return "larger than the egress MTU"
	}
	return ""
}

const (
	maxDTLSRecords = 32
	maxQUICPackets = 9 // the first and 8 coalesced behind it
)

// plainUnicast is the program's plain_unicast.
func plainUnicast(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.Is4() {
		a := ip.As4()[0]
		return a != 0 && a != 127 && a < 224
	}
	b := ip.As16()
	return b[0] != 0xff && binary.BigEndian.Uint64(b[:8]) != 0
}

// onLink reports whether ip is on the namespace's interface subnets.
func onLink(ip netip.Addr) bool {
	return netip.MustParsePrefix("192.0.2.0/24").Contains(ip) || netip.MustParsePrefix("2001:db8::/64").Contains(ip)
}

// dtlsRecords counts the records of a datagram as far as they parse.
func dtlsRecords(b []byte, cidLen int) int {
	n := 0
	for len(b) > 0 {
		_, k, err := dtls.ParseRecord(b, cidLen)
		if err != nil {
			break
		}
		n++
		b = b[k:]
	}
	if len(b) > 0 {
		n++ // the program walks into it too
	}
	return n
}

// dtls13Reached: classify_dtls's walk of b meets a DTLS 1.3 record (a
// unified header, or an ACK with a whole record header) before it fails or
// ends.
func dtls13Reached(b []byte, cidLen int) bool {
	off := 0
	for i := 0; i < maxDTLSRecords && off < len(b); i++ {
		rem := b[off:]
		if dtls.IsUnified(rem[0]) || len(rem) >= 13 && rem[0] == byte(dtls.ACK) {
			return true
		}
		if len(rem) < 13 || (uint16(rem[1])<<8|uint16(rem[2])|2) != 0xfeff {
			return false
		}
		hl := 13
		if rem[0] == byte(dtls.TLS12CID) {
			hl += cidLen
			if len(rem) < hl {
				return false
			}
		} else if rem[0] < 20 || rem[0] > 23 {
			return false
		}
		l := int(rem[hl-2])<<8 | int(rem[hl-1])
		if l == 0 || l > len(rem)-hl {
			return false
		}
		off += hl + l
	}
	return false
}

// quicPackets counts the packets of a datagram up to its zero padding, as
// far as they parse.
func quicPackets(b []byte, cidLen int) int {
	n := 0
	for len(b) > 0 {
		if n > 0 && allZero(b) {
			break
		}
		h, err := quic.ParseHeader(b, cidLen)
		if err != nil || h.Len == 0 {
			return n + 1
		}
		n++
		b = b[h.Len:]
	}
	return n
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// hasTLVs reports a PROXY v2 PROXY header, within b, whose address block
// is longer than its addresses: the program leaves TLVs (a CRC32C to
// check) to the pipeline before it reads them.
func hasTLVs(b []byte) bool {
	if len(b) < 16 || string(b[:12]) != ppv2.Signature || b[12] != 0x21 {
		return false
	}
	blk := int(binary.BigEndian.Uint16(b[14:]))
	if 16+blk > len(b) {
		return false
	}
	switch b[13] {
	case 0x12:
		return blk > 12
	case 0x22:
		return blk > 36
	}
	return false
}

// dtlsFirstCIDMisfits is the program's walk up to the first tls12_cid
// record: the records before it are well formed, and it does not fit
// under cidLen (too short for its header, or a length of 0 or past the
// end).
func dtlsFirstCIDMisfits(b []byte, cidLen int) bool {
	off := 0
	for i := 0; i < maxDTLSRecords && off < len(b); i++ {
		rem := b[off:]
		if len(rem) < 13 || (uint16(rem[1])<<8|uint16(rem[2])|2) != 0xfeff {
			return false
		}
		hl := 13
		if rem[0] == byte(dtls.TLS12CID) {
			hl += cidLen
			if len(rem) < hl {
				return true
			}
			l := int(rem[hl-2])<<8 | int(rem[hl-1])
			return l == 0 || l > len(rem)-hl
		}
		if rem[0] < 20 || rem[0] > 23 {
			return false
		}
		l := int(rem[11])<<8 | int(rem[12])
		if l == 0 || l > len(rem)-hl {
			return false
		}
		off += hl + l
	}
	return false
}

// quicRejectedHandshakeOfOtherLen: the classifier rejects b, whose first
// packet is a v1 or v2 Handshake with a DCID length byte other than
// cidLen (the program's handshake_of_other_len).
func quicRejectedHandshakeOfOtherLen(b []byte, cidLen int) bool {
	if len(b) < 6 || b[0]&0x80 == 0 || int(b[5]) == cidLen {
		return false
	}
	v, t := binary.BigEndian.Uint32(b[1:5]), b[0]>>4&3
	if !(v == 1 && t == 2 || v == 0x6b3343cf && t == 3) {
		return false
	}
	_, err := cidroute.QUICClassifier{CIDLen: cidLen}.Classify(b)
	return err != nil
}
