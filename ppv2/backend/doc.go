// Package backend is the backend side of PROXY protocol v2 over UDP: a
// net.PacketConn that a DTLS or QUIC server (pion/dtls, quic-go, or plain
// code) reads and writes as if clients sent to it directly, while the
// datagrams actually pass through cidroute proxies.
//
// # Receive: inspect
//
// Each datagram is sniffed for the PPv2 signature ("sniff, don't require"):
//
//   - With the signature, it is accepted only when its measured sender is in
//     Config.TrustedProxies (else dropped, DroppedUntrusted, and logged at
//     most every 10 s with the sender and the trusted set: a client of a
//     backend whose trusted set misses the proxies sees only a handshake
//     timeout) and the header parses (else DroppedBadHeader). A PROXY header is stripped and the
//     reader gets the payload with an Addr that keeps the claimed client
//     (Addr.Client), the service address the proxy wrote as destination
//     (Addr.Service) and the measured proxy (Addr.Proxy) apart. A LOCAL
//     header (a proxy's own traffic: a health probe) is delivered as a
//     direct datagram from the proxy, as the protocol says, with
//     Addr.Local set, or dropped with Config.DropLocal.
//   - Without it, Config.Direct decides: accept as direct (default, so PPv2
//     can be enabled on backends before proxies), drop only datagrams that
//     start a session (DTLS ClientHello, QUIC Initial/0-RTT; so no new client
//     bypasses the proxy tier), or drop all.
//
// A zero Config trusts no proxy: every datagram with the signature is
// dropped, so that a backend never believes a client address nobody was
// named to vouch for. DefaultTrustedProxies returns the loopback networks,
// for proxies on the backend's own host (the example backends use it as
// their flag's default); ParseTrustedProxies reads a list of the proxies'
// networks from a flag. Every datagram is counted once
// (Stats). Reading allocates nothing in steady
// state: ReadFrom hands out a shared *Addr per (client, service, proxy), and
// ReadFromAddr returns the Addr by value.
//
// # Send: the reply path and the route table
//
// A reply leaves through the proxy that most recently delivered an
// authenticated datagram of its connection, so that a connection survives
// the death of the proxy replica it came through: when the load balancer
// re-hashes the client to another replica, the client's address does not
// change, only the proxy does. The adapter cannot authenticate a datagram;
// the DTLS or QUIC stack does, and moves the connection's peer address
// after it did. So the proxy is part of the peer address the stack sees:
//
//   - A reply to a datagram is written to the Addr ReadFrom returned with
//     it, or to the one the stack moved the connection to since. It carries
//     its own measured proxy, and leaves through that proxy with the reverse
//     header (source = Addr.Service, destination = Addr.Client). No table is
//     consulted: a second request (Q2, via proxy B) cannot redirect the reply
//     to a first one (Q1, via proxy A) to another client address.
//   - A message the server starts later names only the client (a
//     *net.UDPAddr, or WriteToCID with the session's connection ID), and goes
//     through the route table: the newest committed route of that client
//     address, or of that CID once the session has one. The table is bounded
//     (Config.MaxRoutes) and routes expire (Config.RouteIdle).
//
// A route is committed only after the protocol layer accepted a datagram, in
// two phases: ReadFrom inspects (nothing is committed), the DTLS or QUIC stack
// authenticates, and then the route is committed, so a forged datagram cannot
// redirect replies. Commit does it explicitly; by default a write to a proxied
// Addr also commits that client's route (commit-on-write), which is sound for
// stacks that write to a peer address only once they accepted a datagram from
// it:
//
//   - pion/dtls v3 writes every record to its Conn's remote address, which it
//     sets when the session is created and moves only when an authenticated
//     tls12_cid record with the newest sequence number arrives from another
//     address (RFC 9146 §6); it tells addresses apart by identity, and
//     ReadFrom hands out one *Addr per (client, service, proxy), so a new
//     proxy is a new address. The piondtls package (dtls/piondtls) runs pion
//     over a Conn and, on each write, also commits the session's CID; it
//     sends through the newest proxy of the session's client address in the
//     moment before pion has moved the session, and for sessions without a
//     CID, which pion never moves.
//   - quic-go writes to a connection's active path. It tells paths apart by
//     Addr.String, which names the client and the proxy: datagrams of the
//     connection arriving through another proxy are a new path, which
//     quic-go validates (PATH_CHALLENGE, answered only by the real client)
//     and then switches to. When a replica dies, the stall is one PTO of
//     the client (until its next packet reaches the new replica) plus one
//     round trip for the validation; up to three PTOs when a bulk transfer
//     has the client congestion-blocked, which delays its PATH_RESPONSE to
//     its next, doubled PTO. The connection then resets its congestion
//     controller, as after any migration. quic-go validates a path with
//     a connection ID the client issued and has not used yet; quic-go
//     clients issue several, and a client with zero-length connection IDs
//     needs none.
//
// Writes put the header and the payload in two iovecs of one datagram
// (udpio); the payload is not copied. Writing to a *Addr allocates nothing.
//
// # Health probes
//
// A proxy tells a live backend from a dead one by the protocol, not by the
// port: it sends through the same PPv2 path as client traffic the first
// datagram of a session, and a backend whose DTLS or QUIC stack works
// answers it without opening a session. The contract, for the prober:
//
//   - The datagram is a PPv2 header with the LOCAL command (0x20, the
//     command the PROXY protocol defines for a proxy's own health checks;
//     family and addresses unspecified, 16 bytes), then the payload.
//   - It is sent from an address in the backend's TrustedProxies (a LOCAL
//     header from anyone else is dropped as untrusted). The answer comes
//     back to that address and port without a PPv2 header, since LOCAL
//     means "use the real connection endpoints": send from a socket of the
//     prober's own, not the proxy's upstream socket, whose reverse path
//     would drop a reply without a header.
//   - DTLS: the payload is a ClientHello (client_version DTLS 1.2, fe fd,
//     no cookie) in one epoch-0 record (record version fe ff or fe fd); a
//     healthy backend answers with a datagram whose first record is a
//     HelloVerifyRequest or a ServerHello (handshake types 3 and 2). The
//     HelloVerifyRequest carries the ClientHello's record sequence number
//     (RFC 6347 §4.2.2; the piondtls listener sets it), which ties it to
//     the probe: the prober sends a random one. Offer
//     the cipher suites the backends use: a server that skips the cookie
//     exchange answers a ClientHello it shares no suite with by an alert.
//   - QUIC: the payload is a long-header packet with a version reserved
//     for negotiation (0x?a?a?a?a, RFC 9000 §15), a destination connection
//     ID of 8 to 20 random bytes and a source connection ID, padded to at
//     least 1200 bytes (servers ignore smaller ones); a healthy backend
//     answers with a Version Negotiation packet (version 0) whose
//     connection IDs are the probe's, swapped.
//   - Anything else, or nothing within the prober's timeout, is a failure.
//     A backend that drains (it takes no new sessions) stops answering, so
//     that a probe-down backend and a draining one are treated alike.
//
// The backend keeps no state and writes no log line per probe: the Conn
// delivers the payload as from Addr{Client: prober, Local: true}; quic-go
// answers a reserved version with Version Negotiation statelessly; the
// piondtls listener answers a LOCAL ClientHello with pion's own first
// flight from a handshake it then discards, and opens no session.
//
// # quic-go
//
// quic-go accepts any net.PacketConn as Transport.Conn. Conn forwards
// SetReadBuffer, SetWriteBuffer and SyscallConn, so quic-go sizes the socket
// buffers without its warning; it is not an OOBCapablePacketConn, so quic-go
// uses plain ReadFrom/WriteTo (no GSO, no ECN). The PPv2 header (28 bytes for
// IPv4, 52 for IPv6) travels on the backend–proxy hop only; the proxy's
// MaxDatagram must leave room for it.
package backend
