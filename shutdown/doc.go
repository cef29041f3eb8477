// Package shutdown stops a backend server the way a Kubernetes pod is
// stopped: at the first SIGTERM it drains (refuses new sessions, serves the
// open ones, which cidroute proxies keep routing to it by their CIDs, up to
// a deadline below the pod's termination grace period), and closes the
// sessions left; a second signal stops it at once.
//
//	drain, kill := shutdown.Signals()
//	// ... start srv ...
//	shutdown.Drain(drain, kill, srv, shutdown.Config{Timeout: 110 * time.Second, Logger: log})
//
// A *piondtls.Listener is a Drainer, and so are the echo servers of
// dtls/piondtls/dtlsecho and quic/quicgo/quicecho. Standard library only.
package shutdown
