// Package piondtls runs pion/dtls v3 servers behind cidroute proxies: over
// a backend.Conn (the PROXY protocol v2 adapter) instead of a *net.UDPConn,
// which pion's own dtls.Listen requires.
//
// Listen (pion's Config) and ListenWithOptions (pion v3.1's options) return
// a Listener whose Accept gives one *pion.Conn per DTLS session. The
// server's connection ID generator should come from Generator, so that
// every CID carries the backend's ordinal and the proxies route
// established sessions by it. Below the Listener, a PacketListener
// demultiplexes the socket's datagrams into one net.PacketConn per session
// (by the CID of a tls12_cid record first, then by the claimed client
// address; a ClientHello from an unknown address starts a session), for
// users who call pion themselves.
//
// The Listener answers a proxy's health probes (package health) without
// opening a session, tying its HelloVerifyRequest to the probe. DataProbe
// is the prober's side of a deeper check, for the proxy: a full handshake
// and one echo through the PROXY path, which fails a backend that answers
// hellos but drops its sessions' data.
//
// # Sessions follow their client and their proxy
//
// Sessions learn their CID from the ServerHello pion sends (its
// connection_id extension). pion moves a session's remote address only
// when an authenticated tls12_cid record with the newest sequence number
// arrives from a new address (RFC 9146); it then writes to that address.
// That write is where the session is re-keyed under the new client address
// and the route is committed in the backend.Conn, with the CID, so a
// forged datagram, which pion rejects, cannot move a session or its
// replies. Each pion.Conn's RemoteAddr is a *backend.Addr: the claimed
// client and the measured proxy, kept apart.
//
// When the client's address stays and only its proxy changes (the replica
// it came through died, and the load balancer re-hashed the client), a
// session's replies go through the proxy of its newest datagram that
// carried the session's CID, a datagram only the client or its path can
// produce; for a session without a CID, which pion never moves, through
// the proxy of its newest datagram.
//
// # Health probes and draining
//
// A ClientHello under a PPv2 LOCAL header is a proxy's health probe (the
// contract is in the backend package's documentation): the Listener
// answers it with pion's own first flight, a HelloVerifyRequest (or the
// ServerHello when the server skips the cookie exchange), from a handshake
// it then discards. No session is opened, nothing reaches Accept, nothing
// is logged.
//
// Listener.Drain is a graceful stop: new sessions are refused, probes go
// unanswered, the accepted sessions are served until they end or the
// drain's deadline passes, and those left are closed with close_notify and
// counted, so that their clients open new sessions elsewhere.
//
// A ClientHello that answers a HelloVerifyRequest (message_seq 1, with the
// cookie) from a client without a session here is dropped and counted
// (Stats.DroppedForeignHello): its cookie exchange began at another
// backend, and the proxies sent its second half here because their
// backends changed in between (docs/design.md). pion could never finish
// such a handshake, and a session made from it would take the client's
// next handshake from the same address with it.
//
// # Timers for devices that sleep
//
// Nothing in the adapter ends a session by default: a session lives until
// the application or pion closes it. Config.SessionIdle (ListenConfig,
// ListenWithOptions, NewPacketListener) closes one that received nothing
// for that long, and Config.MaxSessions bounds how many live at once, so
// that a fleet of devices that vanish without a close_notify does not
// grow the server. The return routes of server-initiated datagrams expire
// in the backend.Conn (backend.Config.RouteIdle). For LwM2M devices in
// queue mode both are set past the registration lifetime
// (docs/backends.md, "LwM2M fleets").
//
// On the client side, an EdgeDialer reaches a service through the best of
// its edges (package edge), and moves its session from edge to edge
// without a handshake: a record with a connection ID belongs to the
// session, and every cidroute edge routes it to the backend that issued
// the CID.
//
// The package keeps pion out of the core: only this package and its users
// compile pion, imported here as pion (pion.Config, pion.ServerOption).
package piondtls
