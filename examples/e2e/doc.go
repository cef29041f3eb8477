// Package e2e holds cidroute's end-to-end tests: real peers on loopback,
// no mocks. Proxy replicas are cidroute.Pipelines started in-process from
// the same seed, backends and public address; backends are the example
// servers (dtls/piondtls/dtlsecho, quic/quicgo/quicecho) behind the PPv2 adapter
// (ppv2/backend) and, for DTLS, the session demultiplexer
// (dtls/piondtls); clients are pion/dtls v3 and v2, quic-go and OpenSSL's
// s_client.
//
// Files are named by the peer they exercise:
//
//   - pion_*: pion/dtls v3 clients with connection IDs (sessions, NAT
//     rebinding, draining, removal, claimed versus measured addresses),
//     and pion/dtls v2 (no RFC 9146) routed by client address.
//   - quic_*: quic-go connections, including migration to a new address.
//   - openssl_*: OpenSSL's DTLS 1.2 client (skipped without openssl unless
//     CIDROUTE_REQUIRE_TOOLS=1).
//   - transparent_*: transparent mode (no PPv2) with OpenSSL s_client and
//     s_server, libcoap's coap-client and coap-server, and stock pion
//     servers; the memory-per-session benchmark.
//   - soak_*: the soak and fault suite: backend and replica restarts,
//     scale-out and drain, registry failure, rebinding storms, floods and
//     spoofed replies, rate limits; `go test -run TestSoak -soak=2m -v`
//     for the long run and docs/testing.md's table.
//   - handover_*: cidproxy replaced on its host (-handover) by the same
//     build and by another one, and SIGHUP reloads of each kind, under
//     examples/loadgen at 50,000 datagrams/s: 0 lost, each process
//     balanced. soak_day_*: the day in the life, the everyday changes in
//     sequence under pion and quic-go clients that rebind and migrate
//     (-soak lengthens it; docs/testing.md's table).
//   - hostile_*: the hostile-input suite: the attacks of the hardening
//     review replayed against the cidproxy binary, one case per attack.
//   - edge_*: clients choosing among edges at real distance (package edge,
//     the pion and quic-go edge dialers): each test runs in a child process
//     in its own network namespace, with the edges and the backends in
//     namespaces of their own and the client-edge links delayed by a TUN
//     delay line; hysteresis, failback, the DTLS switch without a
//     handshake, QUIC reconnects with 0-RTT. They need root and ip(8), and
//     skip without them unless CIDROUTE_REQUIRE_TOOLS=1.
//
// Every test stops its replicas at the end and checks each one's counter
// identity: received = forwarded + Σ dropped, in both directions.
//
//	go test -race ./examples/e2e/
package e2e
