// Package monitoring holds what an operator loads next to cidproxy, and the
// tests that keep it true to the binary:
//
//   - cidroute.rules.yml: the alerts as a plain Prometheus rules file (the
//     same groups are in examples/kubernetes/monitoring/prometheusrule.yaml);
//     each links to its runbook in docs/runbooks.md.
//   - cidroute.rules_test.yml: a promtool unit test for every alert.
//   - grafana-dashboard.json: the tier's dashboard.
//
// The tests run promtool (Debian package prometheus; skipped without it
// unless CIDROUTE_REQUIRE_TOOLS=1), check that every drop reason the
// pipeline counts is covered by one alert, and scrape a running cidproxy to
// check that every metric the rules and the dashboard query exists.
package monitoring
