//go:build !unix

package cidroute

// fdLimit reports no limit: the system has no RLIMIT_NOFILE.
func fdLimit() (uint64, bool) { return 0, false }
