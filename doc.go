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
// # Rules
//
// A Router holds one service's two rules, pure functions with no sockets:
//
//   - Router.Forward (client → backend): classify the datagram, apply the
//     admission limits, pick the backend by the routing table of the
//     design document (docs/design.md in the repository), refuse
//     the proxy's own addresses, and write the PPv2 header;
//   - Router.Reverse (backend → client): accept a reply only from a
//     backend, with a PPv2 header whose source is the service's public
//     address and whose destination is a client the service may answer
//     (never the proxy's own addresses), and return its payload.
//
// Each reads a View: the registry snapshot, its staleness, the process's
// own addresses (OwnAddrs) and the admission state, taken once per batch.
// Every datagram a rule refuses names its Reason.
//
// # Pipeline
//
// A Pipeline is the proxy built from them. For each Service it binds
// Workers SO_REUSEPORT sockets (package udpio), or serves the sockets the
// caller opened (Service.Conns); each worker reads a batch
// with recvmmsg, applies Forward to every datagram and sends the routed
// ones with sendmmsg from its upstream socket, header and payload as two
// iovecs; the upstream reads the backends' replies in batches, applies
// Reverse and sends the payloads to the clients from the service socket,
// so that clients see the service address. In transparent mode
// (RouterConfig.Transparent) there is no header: each flow (client and
// backend) gets its own connected upstream socket, in a table bounded by
// Service.MaxSessions and RLIMIT_NOFILE; with Service.OriginalSource
// that socket is bound to the client's own address (IP_TRANSPARENT), so
// the backend sees the device. The Pipeline keeps the process's
// own addresses current (rtnetlink on Linux), counts every datagram once
// per service and direction (Stats: received = forwarded + Σ dropped) and
// stops cleanly on Close or when its context ends.
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
