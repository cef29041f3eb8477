// Package promcollector exports a cidroute proxy's counters as Prometheus
// metrics: a prometheus.Collector that reads, at scrape time, a Pipeline's
// Stats, its services' registries and health checkers, and the counters
// of any fast path beside it (the XDP program), so that the packet path
// does no metrics work at all.
//
// It is its own module (github.com/cidroute/cidroute/promcollector), so
// that only a program that imports it compiles client_golang. cidproxy
// serves exactly these metrics; the alert rules and the dashboard in
// examples/monitoring query them:
//
//	cidroute_datagrams_total{service, direction, outcome, reason, path}
//	cidroute_datagrams_received_total{service, direction, path}
//	cidroute_sessions{service}, cidroute_sessions_max{service}
//	cidroute_sessions_evicted_total{service}
//	cidroute_registry_backends{service, state}
//	cidroute_registry_snapshot_age_seconds{service}
//	cidroute_registry_stale{service}
//	cidroute_registry_rejected_updates_total{service}
//	cidroute_registry_snapshot_version{service}
//	cidroute_registry_slow_starting_backends{service}
//	cidroute_probes_total{service, ordinal, result}
//	cidroute_backend_probe_up{service, ordinal}
//	cidroute_probe_duration_seconds{service} (a histogram)
//
// Every drop reason a direction can count (cidroute.ForwardDrops,
// cidroute.ReverseDrops) is exported from the first scrape, at 0, so that
// rate() and alerts see it before the first drop and a reason added to
// the library cannot go missing here; any other reason appears once it
// counts something. For each service and direction, received equals
// forwarded plus the sum over the drop reasons, per path.
package promcollector
