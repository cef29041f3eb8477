package ppv2

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/netip"
)

// Parse's errors carry fixed context so that returning one allocates
// nothing: a flood of bad datagrams must not cost garbage.
var (
	errShort        = fmt.Errorf("ppv2: fewer than 16 header bytes: %w", ErrTruncated)
	errVersion      = fmt.Errorf("ppv2: version nibble is not 2: %w", ErrVersion)
	errCommand      = fmt.Errorf("ppv2: command is neither LOCAL nor PROXY: %w", ErrCommand)
	errLength       = fmt.Errorf("ppv2: header length runs past the end of the datagram: %w", ErrTruncated)
	errStream       = fmt.Errorf("ppv2: PROXY header for a STREAM (TCP) connection: %w", ErrStream)
	errUnspec       = fmt.Errorf("ppv2: PROXY header with family UNSPEC: %w", ErrFamily)
	errUnix         = fmt.Errorf("ppv2: PROXY header with family AF_UNIX: %w", ErrFamily)
	errFamilyByte   = fmt.Errorf("ppv2: undefined family/transport byte: %w", ErrFamily)
	errShortBlock4  = fmt.Errorf("ppv2: length shorter than the 12-byte IPv4 address block: %w", ErrFamily)
	errShortBlock6  = fmt.Errorf("ppv2: length shorter than the 36-byte IPv6 address block: %w", ErrFamily)
	errTLVHead      = fmt.Errorf("ppv2: TLV area ends inside a TLV's type and length: %w", ErrTLV)
	errTLVValue     = fmt.Errorf("ppv2: TLV value runs past the end of the header: %w", ErrTLV)
	errCRCLength    = fmt.Errorf("ppv2: CRC32C TLV is not 4 bytes: %w", ErrTLV)
	errCRCDuplicate = fmt.Errorf("ppv2: more than one CRC32C TLV: %w", ErrTLV)
	errCRC          = fmt.Errorf("ppv2: header checksum: %w", ErrChecksum)
)

var zero4 [4]byte

// Parse decodes the PROXY v2 header at the start of datagram b. It returns
// the header and the offset of the payload in b. h.TLVs is a view into b,
// valid only while b is; Parse does not allocate. The rules it applies are
// listed in the package documentation.
func Parse(b []byte) (h Header, payloadOff int, err error) {
	if len(b) < prefixLen {
		n := min(len(b), len(Signature))
		if string(b[:n]) != Signature[:n] {
			return Header{}, 0, ErrNoSignature
		}
		return Header{}, 0, errShort
	}
	if string(b[:len(Signature)]) != Signature {
		return Header{}, 0, ErrNoSignature
	}
	if b[12]>>4 != 2 {
		return Header{}, 0, errVersion
	}
	switch b[12] & 0x0f {
	case 0:
		h.Command = Local
	case 1:
		h.Command = Proxy
	default:
		return Header{}, 0, errCommand
	}
	fam := b[13]
	end := prefixLen + int(binary.BigEndian.Uint16(b[14:16]))
	if end > len(b) {
		return Header{}, 0, errLength
	}
	n := end - prefixLen
	tlvOff := end // where the TLVs start; end means none

	if h.Command == Proxy {
		switch fam {
		case famUDP4:
			if n < addrLen4 {
				return Header{}, 0, errShortBlock4
			}
			h.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[16:20])), binary.BigEndian.Uint16(b[24:26]))
			h.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[20:24])), binary.BigEndian.Uint16(b[26:28]))
			tlvOff = prefixLen + addrLen4
		case famUDP6:
			if n < addrLen6 {
				return Header{}, 0, errShortBlock6
			}
			h.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[16:32])).Unmap(), binary.BigEndian.Uint16(b[48:50]))
			h.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[32:48])).Unmap(), binary.BigEndian.Uint16(b[50:52]))
			tlvOff = prefixLen + addrLen6
		case famTCP4, famTCP6:
			return Header{}, 0, errStream
		case famUnspec:
			return Header{}, 0, errUnspec
		case famUxStr, famUxDgr:
			return Header{}, 0, errUnix
		default:
			return Header{}, 0, errFamilyByte
		}
	} else {
		var al int
		switch fam {
		case famUnspec:
			al = 0
		case famTCP4, famUDP4:
			al = addrLen4
		case famTCP6, famUDP6:
			al = addrLen6
		case famUxStr, famUxDgr:
			al = addrLenUx
		default:
			return Header{}, 0, errFamilyByte
		}
		if n >= al {
			tlvOff = prefixLen + al
		}
	}

	if tlvOff < end {
		if err := checkTLVs(b[:end], tlvOff); err != nil {
			return Header{}, 0, err
		}
		h.TLVs = b[tlvOff:end:end]
	}
	return h, end, nil
}

// checkTLVs walks the TLVs of hdr (the whole header) from off and verifies a
// CRC32C TLV if there is one.
func checkTLVs(hdr []byte, off int) error {
	crcAt := -1
	for i := off; i < len(hdr); {
		if len(hdr)-i < 3 {
			return errTLVHead
		}
		l := int(binary.BigEndian.Uint16(hdr[i+1:]))
		v := i + 3
		if l > len(hdr)-v {
			return errTLVValue
		}
		if hdr[i] == TypeCRC32C {
			if l != 4 {
				return errCRCLength
			}
			if crcAt >= 0 {
				return errCRCDuplicate
			}
			crcAt = v
		}
		i = v + l
	}
	if crcAt < 0 {
		return nil
	}
	// Three updates rather than one pass over a zeroed stack copy: the copy
	// would escape through crc32's dispatch and allocate.
	c := crc32.Update(0, castagnoli, hdr[:crcAt])
	c = crc32.Update(c, castagnoli, zero4[:])
	c = crc32.Update(c, castagnoli, hdr[crcAt+4:])
	if c != binary.BigEndian.Uint32(hdr[crcAt:]) {
		return errCRC
	}
	return nil
}
