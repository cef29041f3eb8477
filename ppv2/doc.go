// Package ppv2 encodes and decodes PROXY protocol version 2 headers for UDP
// (the HAProxy "proxy-protocol.txt" format, DGRAM transport).
//
// A proxy puts a header in front of each datagram it forwards so the backend
// learns the client's address; the backend answers with the same kind of
// header (source = service, destination = client) so the proxy knows where
// to send the reply. Header and payload share one datagram; the header is
// encoded into its own buffer so the two can go out as two iovecs.
//
// # Wire format
//
//	offset  size  field
//	0       12    signature 0d 0a 0d 0a 00 0d 0a 51 55 49 54 0a
//	12      1     version (high nibble, 2) | command (low nibble: 0 LOCAL, 1 PROXY)
//	13      1     family (high nibble) | transport (low nibble): 0x12 IPv4/DGRAM, 0x22 IPv6/DGRAM, 0x00 UNSPEC
//	14      2     length of what follows (address block + TLVs), big-endian
//	16      12|36 IPv4: src(4) dst(4) sport(2) dport(2); IPv6: src(16) dst(16) sport(2) dport(2)
//	...           TLVs: type(1) length(2) value(length)
//
// # Encoding
//
// AppendHeader writes a PROXY header as IPv4 (28 bytes) when both addresses
// are IPv4 (IPv4-mapped IPv6 counts as IPv4), and as IPv6 (52 bytes)
// otherwise, with any IPv4 side written as ::ffff:a.b.c.d. Address zones are
// not carried. A LOCAL header is written with family UNSPEC and no address
// block. Header.TLVs is appended verbatim after it has been checked to be
// well-formed; a CRC32C TLV (type 0x03) in it gets its checksum filled in.
// AppendHeaderCRC adds such a TLV when there is none. The checksum is
// CRC32C (Castagnoli) over the whole header with the checksum field zeroed.
// Neither allocates when dst has room for the header.
//
// # Decoding
//
// Parse returns a Header whose TLVs field is a view into the datagram, and
// the offset of the payload. The view is valid only as long as the buffer
// is not reused. Parse does not allocate, not even for errors: every error
// it returns is a package-level value (a sentinel, or one wrapping a
// sentinel with fixed context), so a flood of bad datagrams costs no garbage.
// Callers test with errors.Is.
//
// Decoding rules, in the order they are checked:
//
//   - Fewer than 16 bytes that agree with the signature: ErrTruncated.
//     Otherwise no signature: ErrNoSignature. (Sniff is the cheap test for
//     "sniff, don't require".)
//   - Version nibble other than 2: ErrVersion; command other than LOCAL or
//     PROXY: ErrCommand.
//   - The length field points past the end of the datagram: ErrTruncated.
//   - PROXY: the family must be IPv4/DGRAM or IPv6/DGRAM. STREAM (TCP):
//     ErrStream. UNSPEC, AF_UNIX and undefined values: ErrFamily. A length
//     shorter than the family's address block is ErrFamily, not
//     ErrTruncated: the datagram holds every byte the header declares, the
//     header just contradicts itself. Bytes after the address block are TLVs.
//   - LOCAL: the receiver must ignore the family and the addresses, so Src
//     and Dst are left zero. The family byte must still be one of the values
//     the protocol defines (ErrFamily otherwise). When the length covers the
//     family's address block, the bytes after it are TLVs (with UNSPEC, the
//     whole block is TLVs); when it does not, the block is discarded whole.
//   - TLVs: each needs its 3-byte head and its value inside the header
//     (ErrTLV). Unknown types are skipped. A CRC32C TLV must be 4 bytes and
//     appear at most once (ErrTLV) and must match (ErrChecksum).
//
// Decoded addresses are unmapped: an IPv4-mapped IPv6 address comes back as
// IPv4, so decoding what AppendHeader wrote returns the addresses it was given
// (up to mapping and zones), and a mixed-family pair keeps one IPv4 side.
//
// The package opens no sockets; a net.PacketConn adapter for backends lives
// elsewhere.
package ppv2
