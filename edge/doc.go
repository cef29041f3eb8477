// Package edge chooses, for a client, the best of the edge addresses a
// service is reached through (an A/AAAA record with several addresses, or a
// configured list), and keeps choosing while the session lives.
//
// A Chooser measures the way the traffic experiences an edge: with a full
// handshake of the real protocol through it (a UDP "connect" or a bare
// reachability check says nothing: a broken forwarder answers those as
// happily as a working one). The handshake is the caller's ProbeFunc; the
// dialers in dtls/piondtls (pion/dtls v3) and quic/quicgo (quic-go) bring
// theirs. Its rules:
//
//   - Every candidate is probed in parallel, each with its own timeout.
//   - With fewer than two candidates nothing is probed.
//   - The whole ranking is kept, with the address set it was measured from,
//     and persisted through a Store; a restart reuses it, and a changed set
//     (an edge added or removed) discards it and measures again.
//   - When every probe fails the resolver's order is used: choosing never
//     becomes a new way to fail. So does a failing resolver (the last
//     known set is used) and a Store that cannot be written (logged).
//   - While the session is on an edge that is not the best, or a candidate
//     is pending, a watch round runs every Interval (5 minutes) with full
//     jitter, probing the current edge, those ranked above it and those
//     that failed; on the best edge the whole set is measured again once
//     the ranking is MaxAge old.
//   - A switch needs a candidate better by at least MinGain (20 ms) and by
//     at least MinGainPercent (25 %) of the current edge's round-trip time,
//     in Streak (2) rounds in a row.
//   - A switch is a planned move with its own logged reason (Reason), never
//     an error: it does not feed a caller's reconnect backoff.
//   - The name is resolved again, through the system resolver
//     (LookupHost), in every round.
//
// A Chooser follows one session at a time. Its clock and random source can
// be injected, so that its schedule is testable; probe timeouts use real
// time, since they bound real I/O. Everything it does is visible as Events
// and in Stats, and switches are logged with log/slog.
//
// The package uses the standard library only.
package edge
