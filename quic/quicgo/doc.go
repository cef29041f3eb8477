// Package quicgo adapts cidroute's connection ID codecs to quic-go: a
// Generator that a quic-go server sets as Transport.ConnectionIDGenerator,
// so that every CID the server issues (its Initial SCID and the CIDs of its
// NEW_CONNECTION_ID frames) carries the backend's ordinal.
//
// It is a separate package so that importing cidroute/quic does not
// compile quic-go.
package quicgo
