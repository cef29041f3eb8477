// Package cidroute routes UDP datagrams of DTLS 1.2 with Connection ID
// (RFC 9146) and QUIC (RFC 9000, RFC 9369) to the backend that owns the
// session, by the connection ID rather than by the client's address.
//
// Each backend of a service has a stable ordinal (0–254) that it writes into
// every connection ID it issues. A proxy reads the ordinal back out of the
// CID and forwards the datagram to that backend, so a session survives NAT
// rebinding and needs no per-client state on the proxy. New sessions, which
// carry no CID yet, are spread by weighted rendezvous hashing (package hrw),
// which every proxy replica computes identically from the same registry
// snapshot (package registry).
//
// The sub-packages are usable on their own:
//
//   - dtls: DTLS record walking, classification, the ordinal-first CID codec
//   - quic: QUIC header parsing, classification, the QUIC-LB plaintext codec
//   - hrw: the deterministic backend choice for new sessions
//   - ppv2: PROXY protocol v2 for UDP, and a backend-side net.PacketConn
//   - registry: per-service backend snapshots, sources and freshness
//   - udpio: batched socket IO, SO_REUSEPORT groups, kernel CID steering
package cidroute
