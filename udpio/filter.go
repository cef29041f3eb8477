package udpio

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// A Filter describes a classic BPF socket filter (SO_ATTACH_FILTER,
// AttachFilter) for a DTLS service whose connection IDs carry the
// backend's ordinal in the clear: it drops, in the kernel's receive path
// before the datagram takes room in the socket's queue, what can never
// route, and accepts everything else. It looks at the first record only:
//
//   - shorter than a record header (13 bytes): dropped;
//   - content type 20–23 (ChangeCipherSpec, Alert, Handshake, application
//     data), 25 (tls12_cid) or 26 (DTLS 1.3's ACK) with a version other
//     than DTLS 1.2 (fe fd) or 1.0 (fe ff): dropped;
//   - a tls12_cid record too short for its CID, or whose ordinal byte is
//     not in Routable: dropped;
//   - a first byte 001xxxxx (a DTLS 1.3 unified header): accepted (its
//     CID is not checked; no RFC 9147 ciphertext record is shorter than
//     18 bytes, so the length check above drops none);
//   - any other first byte: dropped.
//
// Whatever it accepts the pipeline still classifies in full; what it
// drops the pipeline would have dropped as malformed or unknown_ordinal
// (or, for a CID of another length whose ordinal byte is unknown, as
// cid_length). The kernel counts its drops with the socket's queue
// overflows (KernelDrops).
type Filter struct {
	// CIDLen is the service's CID length (1–255) and OrdinalOffset the
	// ordinal's byte within the CID (a CIDCodec's OrdinalOffset, ≥ 0).
	CIDLen, OrdinalOffset int
	// Routable marks the ordinals whose CID records route: the serving
	// backends of the registry's snapshot. 255 is never routable.
	Routable [256]bool
}

func (f *Filter) validate() error {
	return checkOrdinalByte("filter", f.CIDLen, 255, f.OrdinalOffset)
}

// A socket filter returns how many bytes of the datagram to keep: 0 drops
// it, and more than its length keeps it whole.
const (
	filterDrop   = 0
	filterAccept = 0xffffffff
)

// dtlsHeaderLen is a DTLS 1.2 record header without CID.
const dtlsHeaderLen = 13

// udpHeaderLen is where a socket filter finds the payload: it runs on the
// datagram from its UDP header on (unlike a reuseport program, to which
// the kernel hands the payload).
const udpHeaderLen = 8

// program assembles the filter. It runs on the UDP header and payload. A
// load past the end of the datagram would end a classic BPF program with
// 0, a drop, so every load is guarded by a length check against X = len.
func (f *Filter) program() ([]bpf.Instruction, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	var words [8]uint32 // Routable as a bitmap, 255 never set
	for o := range 255 {
		if f.Routable[o] {
			words[o/32] |= 1 << (o % 32)
		}
	}
	var p labelled
	p.emit(bpf.LoadExtension{Num: bpf.ExtLen}, bpf.TAX{})
	p.jump(bpf.JumpLessThan, udpHeaderLen+dtlsHeaderLen, "drop", "")
	p.emit(bpf.LoadAbsolute{Off: udpHeaderLen, Size: 1})
	p.jump(bpf.JumpEqual, dtlsCIDType, "cid", "")
	p.jump(bpf.JumpLessThan, 20, "drop", "")
	p.jump(bpf.JumpLessThan, 24, "version", "")
	p.jump(bpf.JumpEqual, 26, "version", "")
	p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xe0})
	p.jump(bpf.JumpEqual, 0x20, "accept", "drop")

	p.label("cid")
	p.emit(bpf.TXA{})
	p.jump(bpf.JumpLessThan, uint32(udpHeaderLen+dtlsCIDStart+f.CIDLen), "drop", "")
	p.emit(bpf.LoadAbsolute{Off: uint32(udpHeaderLen + dtlsCIDStart + f.OrdinalOffset), Size: 1})
	p.emit(bpf.StoreScratch{Src: bpf.RegA, N: 0})
	// The ordinal's word of the bitmap into M[1], its bit (ordinal % 32)
	// into X, then that bit of the word. M[1] starts at 0: the kernel's
	// checker refuses a program that may read memory it never wrote, and
	// it cannot tell that one of the eight words always matches.
	p.emit(bpf.LoadConstant{Dst: bpf.RegX, Val: 0}, bpf.StoreScratch{Src: bpf.RegX, N: 1})
	p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpShiftRight, Val: 5})
	for w := range words {
		next := fmt.Sprintf("w%d", w+1)
		p.jump(bpf.JumpEqual, uint32(w), "", next)
		p.emit(bpf.LoadConstant{Dst: bpf.RegA, Val: words[w]})
		p.emit(bpf.StoreScratch{Src: bpf.RegA, N: 1})
		p.jumpAlways("bit")
		p.label(next)
	}
	p.label("bit")
	p.emit(bpf.LoadScratch{Dst: bpf.RegA, N: 0})
	p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 31}, bpf.TAX{})
	p.emit(bpf.LoadScratch{Dst: bpf.RegA, N: 1})
	p.emit(bpf.ALUOpX{Op: bpf.ALUOpShiftRight})
	p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 1})
	p.jump(bpf.JumpEqual, 0, "drop", "version")

	p.label("version")
	p.emit(bpf.LoadAbsolute{Off: udpHeaderLen + 1, Size: 2})
	p.jump(bpf.JumpEqual, 0xfefd, "accept", "")
	p.jump(bpf.JumpEqual, 0xfeff, "accept", "drop")

	p.label("accept")
	p.emit(bpf.RetConstant{Val: filterAccept})
	p.label("drop")
	p.emit(bpf.RetConstant{Val: filterDrop})
	return p.resolve()
}

// accepts is the Go reference of the program, for the tests that check
// the assembled program against it: b is the UDP payload.
func (f *Filter) accepts(b []byte) bool {
	if len(b) < dtlsHeaderLen {
		return false
	}
	version := b[1] == 0xfe && (b[2] == 0xfd || b[2] == 0xff)
	switch t := b[0]; {
	case t == dtlsCIDType:
		if len(b) < dtlsCIDStart+f.CIDLen {
			return false
		}
		o := b[dtlsCIDStart+f.OrdinalOffset]
		return o != 255 && f.Routable[o] && version
	case t >= 20 && t <= 23 || t == 26:
		return version
	default:
		return t&0xe0 == 0x20
	}
}
