// Package dtls walks and classifies the records of DTLS 1.2 datagrams
// (RFC 6347) that may carry a connection ID (RFC 9146) and of DTLS 1.3
// datagrams (RFC 9147), and provides the ordinal-first connection-ID codec
// a proxy uses to route them.
//
// A datagram holds one or more records back to back. Classify walks all of
// them and says whether the datagram belongs to an established session (it
// holds a tls12_cid record, or a DTLS 1.3 unified header with a CID, whose
// CID names the backend) or is new (no CID: a ClientHello, or a session
// that did not negotiate CIDs), or why it is malformed. The CID length is
// not on the wire; it comes from configuration, as it does in every DTLS
// implementation.
//
// Parsed values hold views into the caller's buffer: Record.CID,
// Record.Fragment and Class.CID are valid only while that buffer is and
// must be copied to be kept. Parsing does not allocate, also not when it
// fails: errors are the package's sentinel values, returned unwrapped, so
// a flood of garbage costs no garbage collection. Compare them with
// errors.Is.
//
// OrdinalFirst writes a backend's ordinal (0–254) into byte 0 of every CID
// the backend issues; Generator turns it, or any other CID codec, into
// pion/dtls v3's Config.ConnectionIDGenerator without this package
// importing pion. With the encrypted QUIC-LB codec (quic.LBEncrypted) DTLS
// CIDs hide the ordinal too: see its documentation for what that protects
// and what it does not.
//
// All functions and methods are safe for concurrent use.
package dtls
