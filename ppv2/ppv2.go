package ppv2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"

	"github.com/cidroute/cidroute/internal/addr"
)

// Signature opens every PROXY protocol v2 header.
const Signature = "\r\n\r\n\x00\r\nQUIT\n"

// Lengths of a PROXY header without TLVs.
const (
	HeaderLen4 = 28 // IPv4/DGRAM
	HeaderLen6 = 52 // IPv6/DGRAM
)

// TLV types defined by the protocol. Others are carried and skipped.
const (
	TypeALPN      uint8 = 0x01 // the application protocol
	TypeAuthority uint8 = 0x02 // the host name the client asked for (SNI)
	TypeCRC32C    uint8 = 0x03 // a CRC32C of the header, checked by Parse
	TypeNoop      uint8 = 0x04 // padding
	TypeUniqueID  uint8 = 0x05 // an opaque connection ID of the proxy's
)

const (
	prefixLen = 16 // signature, version|command, family, length
	addrLen4  = 12
	addrLen6  = 36
	addrLenUx = 216

	famUnspec = 0x00
	famTCP4   = 0x11
	famUDP4   = 0x12
	famTCP6   = 0x21
	famUDP6   = 0x22
	famUxStr  = 0x31
	famUxDgr  = 0x32

	maxBlock = 0xffff // the length field is 16 bits
)

// Command is the header's command: Local (the proxy's own traffic, such as a
// health check; addresses are ignored) or Proxy.
type Command uint8

const (
	Local Command = 0 // LOCAL: no addresses; the receiver uses the real endpoints
	Proxy Command = 1 // PROXY: Src and Dst carry the proxied addresses
)

// String returns "LOCAL" or "PROXY", as the specification spells them.
func (c Command) String() string {
	switch c {
	case Local:
		return "LOCAL"
	case Proxy:
		return "PROXY"
	}
	return fmt.Sprintf("Command(%d)", uint8(c))
}

// Header is a decoded PROXY protocol v2 header.
type Header struct {
	// Command is Proxy for forwarded traffic, Local for a proxy's own.
	Command Command
	// Src and Dst are the addresses a Proxy header carries: on the way to a
	// backend, Src is the client and Dst the service; on the way back, the
	// reverse. They are zero for Local.
	Src, Dst netip.AddrPort
	// TLVs is the raw TLV area: type(1) length(2) value, repeated. Parse
	// sets it to a view into the datagram, valid only while that buffer is;
	// AppendHeader copies it (after checking that it is well-formed).
	TLVs []byte
}

// Errors. Parse and the encoders wrap them with context; test with errors.Is.
var (
	ErrNoSignature = errors.New("ppv2: no PROXY v2 signature")                      // not a PPv2 datagram at all
	ErrVersion     = errors.New("ppv2: unsupported version")                        // the version nibble is not 2
	ErrCommand     = errors.New("ppv2: unsupported command")                        // neither LOCAL nor PROXY
	ErrFamily      = errors.New("ppv2: unsupported or inconsistent address family") // not IPv4/IPv6, or addresses that do not match it
	ErrTruncated   = errors.New("ppv2: truncated")                                  // the header runs past the datagram
	ErrTLV         = errors.New("ppv2: malformed TLV")                              // a TLV runs past the header, or a bad CRC32C TLV
	ErrChecksum    = errors.New("ppv2: CRC32C mismatch")                            // the CRC32C TLV does not match the header
	ErrStream      = errors.New("ppv2: STREAM transport in a datagram")             // a TCP header, which a UDP proxy never sends
)

var errNoAddr = fmt.Errorf("ppv2: PROXY header needs both addresses: %w", ErrFamily)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Templates of the fixed 16 bytes, one copy each on the encode path.
var (
	tmpl4     = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x21, famUDP4, 0, addrLen4}
	tmpl6     = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x21, famUDP6, 0, addrLen6}
	tmplLocal = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x20, famUnspec, 0, 0}
)

// Sniff reports whether b starts with the PROXY protocol v2 signature, so a
// receiver can accept both proxied and direct datagrams. A datagram Sniff
// accepts can still fail Parse. It does not allocate.
func Sniff(b []byte) bool {
	return len(b) >= len(Signature) && string(b[:len(Signature)]) == Signature
}

// AppendHeader appends the encoded header h to dst and returns the extended
// slice. A Proxy header is IPv4 (HeaderLen4 bytes plus TLVs) when both
// addresses are IPv4 or IPv4-mapped, and IPv6 (HeaderLen6 plus TLVs)
// otherwise, with an IPv4 side mapped; zones are dropped. A Local header
// ignores Src and Dst. h.TLVs is checked and copied; a CRC32C TLV in it has
// its checksum computed. Errors: ErrFamily when a Proxy header lacks an
// address, ErrCommand for another command, ErrTLV for a malformed TLV area or
// one too long for the 16-bit length; dst then comes back unchanged.
// It does not allocate when dst has capacity.
func AppendHeader(dst []byte, h Header) ([]byte, error) {
	if h.Command != Proxy || len(h.TLVs) != 0 {
		return appendGeneral(dst, &h, false)
	}
	return appendProxyHeader(dst, &h)
}

// AppendProxy is AppendHeader for a Proxy header without TLVs, the one a
// proxy writes per datagram, with no Header to build and copy.
func AppendProxy(dst []byte, src, dest netip.AddrPort) ([]byte, error) {
	return appendProxyAddrs(dst, src, dest)
}

// AppendHeaderCRC is AppendHeader with a CRC32C TLV appended after h.TLVs,
// unless h.TLVs already holds one (which is then filled in).
func AppendHeaderCRC(dst []byte, h Header) ([]byte, error) {
	return appendGeneral(dst, &h, true)
}

// is4 reports whether an address's words (internal/addr) are IPv4-mapped,
// ::ffff:a.b.c.d; every IPv4 address reads that way, so this is "is IPv4".
func is4(hi, lo uint64) bool { return hi == 0 && lo>>32 == 0xffff }

// put4 and put6 write the fixed 16 bytes and the address block from the
// addresses' words: word stores, no byte arrays to copy.
func put4(b []byte, src, dst uint64, sport, dport uint16) {
	b = b[:HeaderLen4]
	*(*[prefixLen]byte)(b) = tmpl4
	binary.BigEndian.PutUint32(b[16:20], uint32(src))
	binary.BigEndian.PutUint32(b[20:24], uint32(dst))
	binary.BigEndian.PutUint16(b[24:26], sport)
	binary.BigEndian.PutUint16(b[26:28], dport)
}

func put6(b []byte, shi, slo, dhi, dlo uint64, sport, dport uint16) {
	b = b[:HeaderLen6]
	*(*[prefixLen]byte)(b) = tmpl6
	binary.BigEndian.PutUint64(b[16:24], shi)
	binary.BigEndian.PutUint64(b[24:32], slo)
	binary.BigEndian.PutUint64(b[32:40], dhi)
	binary.BigEndian.PutUint64(b[40:48], dlo)
	binary.BigEndian.PutUint16(b[48:50], sport)
	binary.BigEndian.PutUint16(b[50:52], dport)
}

func appendGeneral(dst []byte, h *Header, addCRC bool) ([]byte, error) {
	al := 0
	var shi, slo, dhi, dlo uint64
	switch h.Command {
	case Local:
	case Proxy:
		if !h.Src.Addr().IsValid() || !h.Dst.Addr().IsValid() {
			return dst, errNoAddr
		}
		shi, slo = addr.Words(h.Src.Addr())
		dhi, dlo = addr.Words(h.Dst.Addr())
		al = addrLen6
		if is4(shi, slo) && is4(dhi, dlo) {
			al = addrLen4
		}
	default:
		return dst, fmt.Errorf("ppv2: encoding %v: %w", h.Command, ErrCommand)
	}
	crcAt := -1 // offset of the checksum in the TLV area
	if len(h.TLVs) > 0 {
		var err error
		if crcAt, err = scanTLVs(h.TLVs); err != nil {
			return dst, err
		}
	}
	extra := 0
	if addCRC && crcAt < 0 {
		crcAt = len(h.TLVs) + 3
		extra = 7 // type 0x03, length 4, checksum
	}
	n := al + len(h.TLVs) + extra
	if n > maxBlock {
		return dst, fmt.Errorf("ppv2: %d bytes of TLVs do not fit the 16-bit length: %w", len(h.TLVs)+extra, ErrTLV)
	}

	start, total := len(dst), prefixLen+n
	if cap(dst)-start < total {
		dst = growSlow(dst, total)
	}
	dst = dst[:start+total]
	b := dst[start:]
	switch al {
	case 0:
		*(*[prefixLen]byte)(b) = tmplLocal
	case addrLen4:
		put4(b, slo, dlo, h.Src.Port(), h.Dst.Port())
	case addrLen6:
		put6(b, shi, slo, dhi, dlo, h.Src.Port(), h.Dst.Port())
	}
	binary.BigEndian.PutUint16(b[14:16], uint16(n))
	t := b[prefixLen+al:]
	if len(h.TLVs) > 0 {
		copy(t, h.TLVs)
	}
	if extra > 0 {
		*(*[3]byte)(t[crcAt-3:]) = [3]byte{TypeCRC32C, 0, 4}
	}
	if crcAt >= 0 {
		c := (*[4]byte)(t[crcAt:])
		*c = [4]byte{}
		binary.BigEndian.PutUint32(c[:], crc32.Checksum(b, castagnoli))
	}
	return dst, nil
}

// scanTLVs checks that t is a well-formed TLV area for encoding and returns
// the offset of a CRC32C TLV's value in it, or -1.
func scanTLVs(t []byte) (crcAt int, err error) {
	crcAt = -1
	for i := 0; i < len(t); {
		if len(t)-i < 3 {
			return -1, fmt.Errorf("ppv2: %d stray bytes at TLV offset %d: %w", len(t)-i, i, ErrTLV)
		}
		l := int(binary.BigEndian.Uint16(t[i+1:]))
		v := i + 3
		if l > len(t)-v {
			return -1, fmt.Errorf("ppv2: TLV %#02x at offset %d: length %d overruns the area: %w", t[i], i, l, ErrTLV)
		}
		if t[i] == TypeCRC32C {
			if l != 4 || crcAt >= 0 {
				return -1, fmt.Errorf("ppv2: CRC32C TLV at offset %d: need one of length 4: %w", i, ErrTLV)
			}
			crcAt = v
		}
		i = v + l
	}
	return crcAt, nil
}

// AppendTLV appends one TLV (type, 16-bit length, value) to dst, for building
// Header.TLVs. A value longer than 65535 bytes is ErrTLV.
func AppendTLV(dst []byte, typ uint8, value []byte) ([]byte, error) {
	if len(value) > maxBlock {
		return dst, fmt.Errorf("ppv2: TLV %#02x value of %d bytes: %w", typ, len(value), ErrTLV)
	}
	dst = append(dst, typ, byte(len(value)>>8), byte(len(value)))
	return append(dst, value...), nil
}

// TLV returns the value of the first TLV of type typ in h.TLVs, as a view
// (capacity limited to the value), and whether there was one. It does not
// allocate.
func (h Header) TLV(typ uint8) ([]byte, bool) {
	t := h.TLVs
	for len(t) >= 3 {
		l := int(binary.BigEndian.Uint16(t[1:3]))
		if l > len(t)-3 {
			break
		}
		if t[0] == typ {
			return t[3 : 3+l : 3+l], true
		}
		t = t[3+l:]
	}
	return nil, false
}
