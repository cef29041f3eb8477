// Package piondtls runs pion/dtls v3 servers behind cidroute proxies: over
// a backend.Conn (the PROXY protocol v2 adapter) instead of a *net.UDPConn,
// which pion's own dtls.Listen requires.
//
// A PacketListener reads the backend.Conn and demultiplexes datagrams into
// one net.PacketConn per DTLS session (by the CID of a tls12_cid record
// first, then by the claimed client address; a ClientHello from an unknown
// address starts a session), for pion's dtls.NewListener. Listen does both.
// The server's Config.ConnectionIDGenerator should come from Generator, so
// that every CID carries the backend's ordinal and the proxies route
// established sessions by it.
//
// Sessions learn their CID from the ServerHello pion sends (its
// connection_id extension). pion moves a session's remote address only
// when an authenticated tls12_cid record with the newest sequence number
// arrives from a new address (RFC 9146); it then writes to that address.
// That write is where the session is re-keyed under the new client address
// and the route is committed in the backend.Conn, with the CID, so a
// forged datagram, which pion rejects, cannot move a session or its
// replies. Each dtls.Conn's RemoteAddr is a *backend.Addr: the claimed
// client (String) and the measured proxy, kept apart.
//
// On the client side, an EdgeDialer reaches a service through the best of
// its edges (package edge), and moves its session from edge to edge
// without a handshake: a record with a connection ID belongs to the
// session, and every cidroute edge routes it to the backend that issued
// the CID.
//
// The package keeps pion out of the core: only this package and its users
// compile pion.
package piondtls
