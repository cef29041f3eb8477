// Package registry keeps the backends of one service as immutable snapshots
// that packet workers read without locks.
//
// A [Registry] holds the current [Snapshot] behind an atomic pointer. A
// source (a [Static] list, a JSON [File], or anything implementing [Source],
// such as a Kubernetes, Consul or DNS watcher) calls [Registry.Update] with
// the whole backend list; the registry validates it, builds a new snapshot
// (including the HRW table over the ready backends) and publishes it in one
// atomic store. An invalid list, an empty one included, is rejected whole
// with an error wrapping one of the Err* sentinels, counted, and the
// previous snapshot stays: every source goes through this one validation.
// A source that cannot even produce a list (a file that does not decode)
// counts that with [Registry.Reject]. [NewStatic] builds a registry that
// holds a fixed list in one call, with no source at all.
//
// A snapshot answers the per-datagram questions without allocating:
// [Snapshot.Serving] (the backend a CID's ordinal names, if it is ready or
// draining), [Snapshot.PickNew] (rendezvous hashing over ready backends, for
// new sessions) and [Snapshot.IsBackend] (whether a reply's physical sender
// is a backend of the service).
//
// # States
//
// A backend is [Ready] (takes new sessions), [Draining] (serves its
// established sessions but takes no new ones, Kubernetes' "serving and
// terminating") or [Gone] (serves nothing; datagrams for its CIDs are
// dropped, never re-hashed onto another backend).
//
// # Health
//
// A health checker (package health probes backends through their DTLS or
// QUIC stack) marks a backend down with [Marks.SetDown], through the
// Marks that [Registry.TakeMarks] gave it. A registry has one live Marks
// at most, and a mark lives only as long as the Marks that set it: taking
// new Marks or releasing them lifts every mark of the old ones, in every
// backend state, so that no mark outlives its checker. The registry
// keeps the source's list and the marks apart and publishes their
// combination: a backend its source calls ready and that is marked down is
// routed as draining (no new sessions, CID sessions kept), and
// [Snapshot.Down] tells it apart from one its source drains. Every reader
// of the snapshot (the pipeline's workers, the XDP fast path) routes by it.
// The marks are per registry, so per proxy replica: replicas that disagree
// differ only in the placement of new sessions on the disputed backend,
// never in the route of a CID.
//
// # Freshness
//
// With [Config.MaxAge] set, a registry whose source has not called Update or
// Confirm for longer than MaxAge turns stale: [Registry.Stale] reports true,
// and the caller refuses new handshakes while established (CID) sessions keep
// flowing, because a stale view may still send new sessions to backends
// that no longer exist, while the owner of a CID is written in the CID
// itself. The flag is flipped by a timer, so Stale is one atomic load and the
// packet path reads no clock. The next Update or Confirm clears it.
//
// Each service has its own Registry; nothing is shared between them, so a
// failing or stale source of one service never affects another.
//
// # JSON format
//
// The JSON form of a backend list, read by [DecodeBackends] and the [File]
// source, and the proxy configuration's "backends" key:
//
//	[
//	  {"ordinal": 0, "address": "10.0.0.10:5684", "weight": 2, "state": "ready"},
//	  {"ordinal": 1, "address": "[fd00::11]:5684"}
//	]
//
// "ordinal" (0–254) and "address" (ip:port, IPv6 in brackets) are required.
// "weight" defaults to 1, as a zero [Backend.Weight] does in Go; an
// explicit 0 is an error ([ErrZeroWeight]), since a file that says 0 means
// "no new sessions", which is what "draining" says. "state" is "ready"
// (the default), "draining" or "gone". Keys are matched exactly
// (case-sensitive); unknown or repeated keys are errors. The list is
// validated whole ([Validate]). "ready_since" (an RFC 3339 time, such as
// "2026-01-02T15:04:05Z") is when the backend became ready, for
// Config.SlowStart; without it a backend counts fully at once.
package registry
