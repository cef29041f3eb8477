package xdp

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// frameOpts are the IP header fields a frame is built with.
type frameOpts struct {
	ttl     uint8
	id      uint16
	df      bool
	noCsum  bool // IPv4: UDP checksum 0 (none)
	badCsum bool // a wrong UDP checksum
}

// sentOpts are the fields of a datagram the program transmits (and Linux
// sends): TTL 64, ID 0, don't fragment.
var sentOpts = frameOpts{ttl: 64, df: true}

// udpFrame builds an Ethernet frame with an IPv4 or IPv6 header (by dst's
// family; src must match) and a UDP datagram with a correct checksum.
func udpFrame(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte, o frameOpts) []byte {
	v4 := dst.Addr().Unmap().Is4()
	b := make([]byte, 0, 14+40+8+len(payload))
	b = append(b, dstMAC...)
	b = append(b, srcMAC...)
	ulen := 8 + len(payload)
	var ipStart int
	if v4 {
		b = append(b, 0x08, 0x00)
		ipStart = len(b)
		frag := uint16(0)
		if o.df {
			frag = 0x4000
		}
		s, d := src.Addr().Unmap().As4(), dst.Addr().Unmap().As4()
		b = append(b, 0x45, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(20+ulen))
		b = binary.BigEndian.AppendUint16(b, o.id)
		b = binary.BigEndian.AppendUint16(b, frag)
		b = append(b, o.ttl, 17, 0, 0)
		b = append(b, s[:]...)
		b = append(b, d[:]...)
		binary.BigEndian.PutUint16(b[ipStart+10:], ^fold(sum(b[ipStart:ipStart+20], 0)))
	} else {
		b = append(b, 0x86, 0xdd)
		ipStart = len(b)
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(ulen))
		b = append(b, 17, o.ttl)
		s, d := src.Addr().As16(), dst.Addr().As16()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	}
	u := len(b)
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(ulen))
	b = append(b, 0, 0)
	b = append(b, payload...)
	if o.noCsum && v4 {
		return b
	}
	c := ^fold(sum(b[u:], pseudo(src.Addr(), dst.Addr(), ulen, v4)))
	if c == 0 {
		c = 0xffff
	}
	if o.badCsum {
		c ^= 0x0101
	}
	binary.BigEndian.PutUint16(b[u+6:], c)
	return b
}

func pseudo(src, dst netip.Addr, ulen int, v4 bool) uint64 {
	var p []byte
	if v4 {
		s, d := src.Unmap().As4(), dst.Unmap().As4()
		p = append(append(p, s[:]...), d[:]...)
		p = append(p, 0, 17)
		p = binary.BigEndian.AppendUint16(p, uint16(ulen))
	} else {
		s, d := src.As16(), dst.As16()
		p = append(append(p, s[:]...), d[:]...)
		p = binary.BigEndian.AppendUint32(p, uint32(ulen))
		p = append(p, 0, 0, 0, 17)
	}
	return sum(p, 0)
}

// sum adds b as big-endian 16-bit words to s (RFC 1071).
func sum(b []byte, s uint64) uint64 {
	for len(b) >= 2 {
		s += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint64(b[0]) << 8
	}
	return s
}

func fold(s uint64) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
