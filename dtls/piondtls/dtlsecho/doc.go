// Package dtlsecho is a pion/dtls v3 echo server behind cidroute proxies:
// the server of examples/dtls-backend and cidproxy's demo, for a backend
// author to start in a test (beside cidroutetest's proxy) or to read as
// the reference for their own server.
//
// A Server reads its UDP socket through ppv2/backend (PROXY protocol v2
// from trusted proxies stripped, the claimed client kept apart from the
// measured proxy) and dtls/piondtls (sessions told apart by connection ID,
// then by client address), and issues ordinal-first connection IDs (or
// any other codec's), so that cidroute proxies route every record of a
// session to it. It logs one line when a session starts, when its client
// moves, and when it ends, never one per datagram; Sessions lists them.
// Drain refuses new sessions and serves the open ones until a deadline,
// as on a pod's SIGTERM (see package shutdown).
package dtlsecho
