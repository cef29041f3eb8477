// Package health tells a live backend from a dead one by its protocol, not
// by its port: it probes each backend of a registry through the same PROXY
// protocol v2 path as client traffic, with the first datagram of a session,
// and marks the backends that do not answer it down in the registry.
//
// A port check passes a backend whose socket is open and whose DTLS or QUIC
// stack is dead (a hung handshake goroutine, a plain UDP responder left on
// the port); a probe that must draw the stack's own answer does not. The
// probes follow the contract of package ppv2/backend ("Health probes"):
//
//   - DTLS: a PPv2 LOCAL header, then a ClientHello (DTLS 1.2, no cookie,
//     a fresh random and a random record sequence number) in one epoch-0
//     record. The answer must be a datagram whose first record is an
//     epoch-0 handshake record holding a plausible answer to it: a
//     HelloVerifyRequest (message_seq 0, unfragmented, a cookie of 1 to
//     255 bytes) or a ServerHello choosing a suite the hello offered. A
//     HelloVerifyRequest that echoes the record sequence number (RFC 6347
//     §4.2.2) is tied to the probe.
//   - QUIC: a PPv2 LOCAL header, then a long-header packet of a version
//     reserved for negotiation (0x?a?a?a?a), random connection IDs, padded
//     to 1200 bytes. The answer must be a Version Negotiation packet whose
//     connection IDs are the probe's, swapped.
//
// An answer that echoes random values of its probe is [Tied] to it; no
// one who cannot see the probe can forge it. Once a backend has answered
// tied, the checker counts an untied answer from it as a bad answer, so
// that answers forged from a frozen backend's address do not keep it up.
// A backend that never ties its answers (a ServerHello without the
// cookie exchange; pion/dtls answering a direct probe) is judged by
// plausibility alone.
//
// Config.Probe replaces the hello probe with another [ProbeFunc]: the
// piondtls adapter's DataProbe runs a full handshake and one echo, for
// backends that can serve it, so that a backend that answers hellos but
// drops data goes down too.
//
// Each probe has its own connected UDP socket: an answer is matched by the
// kernel to the probe that asked (a late answer to an earlier probe dies
// with that probe's socket), an ICMP port unreachable fails the probe at
// once, and no probe shares a budget with another. The answer comes back
// without a PPv2 header, to the prober's own socket, as LOCAL means "the
// real endpoints": the backends must trust the prober's address as a
// proxy (it is the proxy's own address).
//
// # The checker
//
// A [Checker] probes every backend its registry calls ready (or that it
// marked down) once per round: rounds start every Config.Interval, less a
// random part of up to Config.Jitter so that the replicas of a tier do not
// probe in step, and every probe of a round runs in parallel with its own
// Config.Timeout. A backend goes down after Config.Fall failed probes in a
// row (default 3) and up again after Config.Rise successes in a row
// (default 2); a backend the checker has not yet seen answer goes down at
// its first failure, so that a dead backend in a fresh list takes new
// sessions for one round at most. Down is [registry.Marks.SetDown]: the
// backend takes no new sessions and keeps its CID sessions, as a draining
// one does. A backend that drains answers no probes, so probes and
// draining agree.
//
// The marks belong to the running checker: Run takes the registry's
// [registry.Marks] when it starts and releases them when it returns, which
// lifts every mark it set, in every backend state. A checker that
// replaces another (a reload, a restart handover) starts from the marks
// [Checker.Inherit] hands it and keeps or lifts them by its own probes;
// without a checker a registry has no marks.
//
// Detection time: a backend that stops answering right after a successful
// probe is down at most Fall × Interval + Timeout later; one that answers
// again is up within Rise × Interval + Timeout.
//
// Probes write no log line each; a change of state does (down at Warn with
// the last failure, up at Info). Stats gives the counts by result, the
// state of each backend and a histogram of the answers' round-trip times.
//
// # Replicas
//
// Every proxy replica probes on its own, so for a moment (a probe lost on
// one path, a backend failing on one replica's route) replicas can
// disagree about a backend. They then place some new sessions differently:
// rendezvous hashing moves only the disputed backend's keys, so a client
// whose handshake datagrams reach two disagreeing replicas may have to
// retry its handshake. They never disagree about a CID's route, which the
// CID carries and health does not change.
package health
