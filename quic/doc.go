// Package quic parses and classifies client QUIC datagrams for a
// connection-ID router, and provides the QUIC-LB connection ID codecs
// (draft-ietf-quic-load-balancers-21) that backends use to write their
// ordinal into every CID they issue: LB, in the clear, and LBEncrypted,
// AES-128 encrypted with several configurations live for key rotation, so
// that only holders of the key can read or aim at an ordinal.
//
// Parsing follows the version-independent invariants (RFC 8999) for every
// long header, and the v1 (RFC 9000) and v2 (RFC 9369) layouts where the
// version is known: packet types, Initial tokens and the Length field that
// lets Classify walk coalesced packets. Header protection is not removed:
// parsing needs no keys.
//
// Parsers return views into the caller's buffer: the byte slices in Header
// and Class are valid only while that buffer is, and must be copied to be
// kept. ParseHeader, Classify, LB.Ordinal and LBEncrypted.Ordinal do not
// allocate, on success or on error; errors are the package's sentinels,
// returned unwrapped.
//
// Routing by Class.Kind (see the routing table of docs/design.md in the
// repository):
//
//	KindEstablished (short header, Handshake): LB.Ordinal(DCID) → backend;
//	    ok=false (unroutable config rotation) → fallback hash of client address.
//	KindNew (Initial, 0-RTT, unknown version): if len(DCID) == server CID
//	    length and it decodes to a serving ordinal → that backend; else hash
//	    the DCID, which all Initial and 0-RTT packets of an attempt share.
//
// The quic-go adapter that generates such CIDs lives in the quicgo
// sub-package, so that importing this package does not compile quic-go.
package quic
