// Package quicgo adapts cidroute's connection ID codecs to quic-go: a
// Generator that a quic-go server sets as Transport.ConnectionIDGenerator,
// so that every CID the server issues (its Initial SCID and the CIDs of its
// NEW_CONNECTION_ID frames) carries the backend's ordinal.
//
// On the client side, an EdgeDialer reaches a service through the best of
// its edges (package edge) and reconnects, with 0-RTT, when the best edge
// changes or the current one dies: QUIC lets a client move its own
// address, never the server's.
//
// It is a separate package so that importing cidroute/quic does not
// compile quic-go.
package quicgo
