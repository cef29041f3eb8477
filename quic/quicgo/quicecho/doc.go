// Package quicecho is a quic-go echo server behind cidroute proxies: the
// server of examples/quic-backend, for a backend author to start in a test
// (beside cidroutetest's proxy) or to read as the reference for their own
// server.
//
// A Server runs a quic.Transport over ppv2/backend (PROXY protocol v2 from
// trusted proxies stripped, the claimed client kept apart from the measured
// proxy) with quic/quicgo's Generator as its ConnectionIDGenerator, so every
// connection ID it issues, the Initial SCID and those of its
// NEW_CONNECTION_ID frames, carries its ordinal. Each stream echoes what it
// reads. It logs one line when a connection starts, when its client moves
// (connection migration, NAT rebinding) and when it ends; Connections
// lists them. Drain refuses new connections and serves the open ones until
// a deadline, as on a pod's SIGTERM (see package shutdown).
package quicecho
