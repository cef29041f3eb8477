// Package quicgo adapts cidroute's backend side to quic-go: a Generator
// that a quic-go server sets as Transport.ConnectionIDGenerator, so that
// every CID the server issues (its Initial SCID and the CIDs of its
// NEW_CONNECTION_ID frames) carries the backend's ordinal, and a Listener
// that drains.
//
// A quic-go server behind cidroute proxies runs its Transport over a
// ppv2/backend Conn. What the backend side needs from quic-go then works
// unchanged, and is tested here with real peers: a connection whose
// datagrams start arriving through another proxy replica sees a new path
// (backend.Addr.String names the proxy), validates it and moves its
// replies there; a health probe (a reserved-version Initial under a PPv2
// LOCAL header) draws quic-go's stateless Version Negotiation. Listener
// adds a graceful stop: Drain closes the listener, not the transport, so
// new connections are refused while the accepted ones are served until
// they end or a deadline passes, then closed with CONNECTION_CLOSE and
// counted.
//
// On the client side, an EdgeDialer reaches a service through the best of
// its edges (package edge) and reconnects, with 0-RTT, when the best edge
// changes or the current one dies: QUIC lets a client move its own
// address, never the server's.
//
// It is a separate package so that importing cidroute/quic does not
// compile quic-go.
package quicgo
