package ppv2

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"slices"
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
	TypeALPN      uint8 = 0x01
	TypeAuthority uint8 = 0x02
	TypeCRC32C    uint8 = 0x03
	TypeNoop      uint8 = 0x04
	TypeUniqueID  uint8 = 0x05
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
	Local Command = 0
	Proxy Command = 1
)

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
	Command Command
	// Src and Dst are the addresses a Proxy header carries: on the way to a
	// backend, Src is the client and Dst the service; on the way back, the
	// reverse. They are zero for Local.
	Src, Dst netip.AddrPort
	// TLVs is the raw TLV area. Parse sets it to a view into the datagram;
	// AppendHeader copies it verbatim (after checking it is well-formed).
	TLVs []byte
}

// Errors. Parse and the encoders wrap them with context; test with errors.Is.
var (
	ErrNoSignature = errors.New("ppv2: no PROXY v2 signature")
	ErrVersion     = errors.New("ppv2: unsupported version")
	ErrCommand     = errors.New("ppv2: unsupported command")
	ErrFamily      = errors.New("ppv2: unsupported or inconsistent address family")
	ErrTruncated   = errors.New("ppv2: truncated")
	ErrTLV         = errors.New("ppv2: malformed TLV")
	ErrChecksum    = errors.New("ppv2: CRC32C mismatch")
	ErrStream      = errors.New("ppv2: STREAM transport in a datagram")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Templates of the fixed 16 bytes, one copy each on the encode path.
var (
	tmpl4     = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x21, famUDP4, 0, addrLen4}
	tmpl6     = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x21, famUDP6, 0, addrLen6}
	tmplLocal = [prefixLen]byte{'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n', 0x20, famUnspec, 0, 0}
)

// crcTLV is what AppendHeaderCRC appends: type 0x03, length 4, checksum 0
// (filled in afterwards).
var crcTLV = [7]byte{TypeCRC32C, 0, 4}

// Sniff reports whether b starts with the PROXY protocol v2 signature.
func Sniff(b []byte) bool {
	return len(b) >= len(Signature) && string(b[:len(Signature)]) == Signature
}

// AppendHeader appends the encoded header h to dst and returns the extended
// slice. A Proxy header is IPv4 when both addresses are IPv4 (or
// IPv4-mapped), IPv6 otherwise. h.TLVs is checked and copied; a CRC32C TLV in
// it has its checksum computed. It does not allocate when dst has capacity.
func AppendHeader(dst []byte, h Header) ([]byte, error) {
	return appendHeader(dst, h, false)
}

// AppendHeaderCRC is AppendHeader with a CRC32C TLV appended after h.TLVs,
// unless h.TLVs already holds one (which is then filled in).
func AppendHeaderCRC(dst []byte, h Header) ([]byte, error) {
	return appendHeader(dst, h, true)
}

func appendHeader(dst []byte, h Header, addCRC bool) ([]byte, error) {
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
		extra = len(crcTLV)
	}

	var tmpl *[prefixLen]byte
	var src, dstA netip.Addr
	switch h.Command {
	case Local:
		tmpl = &tmplLocal
	case Proxy:
		src, dstA = h.Src.Addr().Unmap(), h.Dst.Addr().Unmap()
		if !src.IsValid() || !dstA.IsValid() {
			return dst, fmt.Errorf("ppv2: PROXY header needs both addresses: %w", ErrFamily)
		}
		tmpl = &tmpl6
		if src.Is4() && dstA.Is4() {
			tmpl = &tmpl4
		}
	default:
		return dst, fmt.Errorf("ppv2: encoding %v: %w", h.Command, ErrCommand)
	}
	al := int(tmpl[15])
	n := al + len(h.TLVs) + extra
	if n > maxBlock {
		return dst, fmt.Errorf("ppv2: %d bytes of TLVs do not fit the 16-bit length: %w", len(h.TLVs)+extra, ErrTLV)
	}

	start := len(dst)
	dst = slices.Grow(dst, prefixLen+n)[:start+prefixLen+n]
	b := dst[start:]
	copy(b, tmpl[:])
	binary.BigEndian.PutUint16(b[14:16], uint16(n))
	switch al {
	case addrLen4:
		s, d := src.As4(), dstA.As4()
		copy(b[16:20], s[:])
		copy(b[20:24], d[:])
		binary.BigEndian.PutUint16(b[24:26], h.Src.Port())
		binary.BigEndian.PutUint16(b[26:28], h.Dst.Port())
	case addrLen6:
		s, d := src.As16(), dstA.As16()
		copy(b[16:32], s[:])
		copy(b[32:48], d[:])
		binary.BigEndian.PutUint16(b[48:50], h.Src.Port())
		binary.BigEndian.PutUint16(b[50:52], h.Dst.Port())
	}
	if n == al {
		return dst, nil
	}
	t := b[prefixLen+al:]
	copy(t, h.TLVs)
	if extra > 0 {
		copy(t[len(h.TLVs):], crcTLV[:])
	}
	if crcAt >= 0 {
		c := t[crcAt : crcAt+4]
		clear(c)
		binary.BigEndian.PutUint32(c, crc32.Checksum(b, castagnoli))
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
