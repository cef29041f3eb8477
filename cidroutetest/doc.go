// Package cidroutetest helps authors of DTLS and QUIC servers test them
// behind cidroute from their own go test, in another module: it starts
// an in-process proxy replica in front of their backends, and gives their
// clients a socket that rebinds the way a NAT does.
//
//   - Start (in a test) or New runs one replica of a service on loopback,
//     with its own registry of the given backends: the datagrams reach the
//     backends behind a PROXY protocol v2 header, exactly as from
//     cidproxy, so the backend's ppv2/backend adapter, CID generator and
//     trusted-proxy list are what is tested. Two replicas with the same
//     seed and backends route every session alike.
//   - ListenRebind opens a client socket (a net.PacketConn for pion/dtls
//     or quic-go) that can move to a fresh source port, or to another
//     replica, in the middle of a session, while the stack on top sees one
//     peer address throughout.
//
// The package needs only the core module: it compiles no pion or quic-go.
package cidroutetest
