package udpio

import (
	"errors"
	"fmt"
	"net/netip"
)

// Sentinel errors. Callers test them with errors.Is.
var (
	// ErrNotSupported is wrapped by functions that need a Linux facility on
	// other systems (SO_REUSEPORT groups, steering, PKTINFO, buffer probing).
	ErrNotSupported = errors.New("udpio: not supported on this platform")
	// ErrTruncated is set as Message.Err on receive when the datagram was
	// larger than Buf; N is then len(Buf) and the tail is lost.
	ErrTruncated = errors.New("udpio: datagram truncated")
	// ErrAddress is set as Message.Err on send when Addr or Local is not
	// valid, or not of a family the socket can send to (an IPv6 address on
	// an IPv4 socket).
	ErrAddress = errors.New("udpio: address not usable on this socket")
	// ErrConfig is wrapped when a configuration value is out of range.
	ErrConfig = errors.New("udpio: invalid configuration")
	// ErrNoOrdinalByte is wrapped (with ErrConfig) by AttachSteering when
	// Steering.OrdinalOffset is negative: the CID codec keeps no octet of
	// the CID in the clear (an encrypted codec such as quic.LBEncrypted),
	// so a classic BPF program cannot read the ordinal. Steer in user
	// space instead, or use a plaintext codec.
	ErrNoOrdinalByte = errors.New("udpio: the CID codec has no plaintext ordinal byte (encrypted CIDs); kernel steering cannot read it")

	// ErrWouldBlock is what a detached Conn's ReadBatch returns when no
	// datagram is queued (Conn.Detach).
	ErrWouldBlock = errors.New("udpio: no datagram queued")

	// ErrInUse is wrapped by ListenGroup when another socket already holds
	// the address (with the syscall's EADDRINUSE): another process, or a
	// SO_REUSEPORT group that this call did not create and was not allowed
	// to join (ListenConfig.JoinExisting).
	ErrInUse = errors.New("udpio: address already in use")
)

// DefaultBatch is the batch size NewConn uses when given 0.
const DefaultBatch = 32

// maxDatagram is the largest UDP payload a socket can carry (IPv6 without
// jumbograms: 65535 - 8).
const maxDatagram = 65535

// A Message is one datagram of a batch. The Buf and Prefix slices are the
// caller's; a Conn only borrows them for the duration of one call.
//
// Addresses are never IPv4-mapped IPv6: a dual-stack IPv6 socket reports an
// IPv4 peer as a 4-byte address, and accepts either form on send. IPv6 zones
// (scope IDs) are not reported.
type Message struct {
	// Prefix is, on send only, an optional header (for example a PROXY
	// protocol v2 header) sent in front of Buf as part of the same datagram,
	// without copying the two together.
	Prefix []byte
	// Buf is, on receive, the buffer offered to the kernel (its length, not
	// its capacity, is the limit); on send, the payload.
	Buf []byte
	// N is, on receive, the number of bytes written into Buf.
	N int
	// Addr is the peer: the source on receive, the destination on send.
	Addr netip.AddrPort
	// Local is, on receive, the destination address of the datagram when
	// the socket has packet info enabled (ListenConfig.PacketInfo), else
	// the zero Addr. On send, when valid, it is the source address the
	// datagram leaves from (IP_PKTINFO / IPV6_PKTINFO), so a reply to a
	// wildcard-bound socket comes from the address the client used.
	Local netip.Addr
	// Err is the per-datagram outcome. On receive it is nil or
	// ErrTruncated. On send it is nil when the kernel accepted the datagram;
	// otherwise ErrAddress, the syscall.Errno the kernel returned for this
	// datagram (EMSGSIZE, ECONNREFUSED, ...), or, after a socket-level
	// failure, the error WriteBatch returned.
	Err error
}

// ListenConfig holds the optional socket settings of ListenGroup. The zero
// value keeps the kernel's defaults.
type ListenConfig struct {
	// RecvBuffer and SendBuffer are the requested SO_RCVBUF and SO_SNDBUF
	// sizes in bytes; 0 keeps the default. With CAP_NET_ADMIN the request is
	// forced past net.core.rmem_max / wmem_max (SO_RCVBUFFORCE); without it
	// the kernel caps it silently. BufferSizes reports what was granted.
	RecvBuffer, SendBuffer int
	// PacketInfo enables IP_PKTINFO (IPv4 sockets) or IPV6_RECVPKTINFO
	// (IPv6 and dual-stack sockets), so Message.Local reports each
	// datagram's destination address.
	PacketInfo bool
	// Joinable sets SO_REUSEPORT on a group of one socket too, so that a
	// later process may join it with JoinExisting (a restart handover);
	// groups of several sockets always have it. Leave it off for sockets
	// nothing should share, such as a proxy's upstream sockets. Ignored
	// where SO_REUSEPORT groups are not supported.
	Joinable bool
	// JoinExisting lets the group join a SO_REUSEPORT group that another
	// process (of the same user: a kernel rule) holds on the address, the
	// first step of handing a running proxy over to a new one. Without it
	// the first socket is bound without SO_REUSEPORT, so ListenGroup fails
	// with ErrInUse when anything holds the address, and only then gets
	// SO_REUSEPORT for its siblings: a second instance started by mistake
	// cannot silently take half of the traffic. With a port 0 there is
	// nothing to join and it is ignored.
	JoinExisting bool
}

func (cfg ListenConfig) validate() error {
	if cfg.RecvBuffer < 0 || cfg.SendBuffer < 0 {
		return fmt.Errorf("buffer sizes %d/%d: %w", cfg.RecvBuffer, cfg.SendBuffer, ErrConfig)
	}
	return nil
}

// Steering describes where a connection ID's ordinal byte sits, for the
// classic BPF program AttachSteering installs on a SO_REUSEPORT group.
//
// The program reads the ordinal byte k of
//   - a DTLS 1.2 tls12_cid record (content type 25, first byte 0xfe of the
//     version): the CID starts at byte 11;
//   - a QUIC short header (high bit 0, fixed bit 0x40 set): the CID starts at
//     byte 1;
//   - a QUIC long header whose DCID length byte (byte 5) equals CIDLen: the
//     CID starts at byte 6;
//
// and delivers the datagram to socket k of the group (group[k] of
// ListenGroup). Everything else, including ordinals ≥ the number of sockets,
// datagrams too short to hold the CID, and QUIC packets whose fixed bit is
// greased (RFC 9287), goes to the socket the kernel's 4-tuple hash picks.
type Steering struct {
	// DTLS enables steering of DTLS 1.2 tls12_cid records.
	DTLS bool
	// QUIC enables steering of QUIC short headers and of long headers
	// carrying a server-chosen DCID.
	QUIC bool
	// CIDLen is the fixed length of the connection IDs the servers issue
	// (1–20 for QUIC, 1–255 for DTLS): a CIDCodec's Len.
	CIDLen int
	// OrdinalOffset is the offset of the ordinal byte within the CID
	// (0 ≤ OrdinalOffset < CIDLen): a CIDCodec's OrdinalOffset. A
	// negative one, which an encrypted codec reports, is refused with
	// ErrNoOrdinalByte.
	OrdinalOffset int
}

func (s Steering) validate() error {
	if !s.DTLS && !s.QUIC {
		return fmt.Errorf("steering: neither DTLS nor QUIC enabled: %w", ErrConfig)
	}
	maxLen := 255
	if s.QUIC {
		maxLen = 20
	}
	return checkOrdinalByte("steering", s.CIDLen, maxLen, s.OrdinalOffset)
}

// checkOrdinalByte checks the CID length (1–maxLen) and the ordinal's
// offset in it that a kernel program (what, for errors) reads.
func checkOrdinalByte(what string, cidLen, maxLen, off int) error {
	switch {
	case cidLen < 1 || cidLen > maxLen:
		return fmt.Errorf("%s: CID length %d: %w", what, cidLen, ErrConfig)
	case off < 0:
		return fmt.Errorf("%s: ordinal offset %d: %w: %w", what, off, ErrNoOrdinalByte, ErrConfig)
	case off >= cidLen:
		return fmt.Errorf("%s: ordinal offset %d outside CID of %d bytes: %w", what, off, cidLen, ErrConfig)
	}
	return nil
}

// Byte layout the steering program and its Go reference share.
const (
	dtlsCIDType    = 25 // ContentType tls12_cid (RFC 9146)
	dtlsCIDStart   = 11 // type(1) version(2) epoch(2) sequence(6)
	quicShortStart = 1
	quicLongDCIDL  = 5 // flags(1) version(4)
	quicLongStart  = 6
)

// steerRef is the Go reference of the steering program: the socket index
// the program returns, or ok=false for "let the kernel hash". It exists for
// tests that check the assembled program against it.
func (s Steering) steerRef(b []byte) (ordinal uint8, ok bool) {
	if len(b) == 0 {
		return 0, false
	}
	switch {
	case s.DTLS && b[0] == dtlsCIDType:
		// Require the whole CID and the record's length field.
		if len(b) < dtlsCIDStart+s.CIDLen+2 || b[1] != 0xfe {
			return 0, false
		}
		return b[dtlsCIDStart+s.OrdinalOffset], true
	case s.QUIC && b[0]&0x80 != 0:
		if len(b) < quicLongStart+s.CIDLen || int(b[quicLongDCIDL]) != s.CIDLen {
			return 0, false
		}
		return b[quicLongStart+s.OrdinalOffset], true
	case s.QUIC && b[0]&0xc0 == 0x40:
		if len(b) < quicShortStart+s.CIDLen {
			return 0, false
		}
		return b[quicShortStart+s.OrdinalOffset], true
	}
	return 0, false
}

// MemInfo is a socket's receive queue as the kernel counts it
// (SO_MEMINFO, ReadMemInfo).
type MemInfo struct {
	// Queued is the memory the datagrams waiting in the queue take, their
	// bookkeeping included (sk_rmem_alloc; a small datagram on loopback
	// takes about 1 KiB), and Limit what the kernel lets the queue take
	// (sk_rcvbuf: twice the SO_RCVBUF asked for). A datagram that would
	// take Queued past Limit is dropped.
	Queued, Limit uint32
	// Drops is the number of datagrams dropped so far (sk_drops, 32 bits,
	// wrapping).
	Drops uint32
}
