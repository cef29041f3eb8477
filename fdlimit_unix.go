//go:build unix

package cidroute

import "golang.org/x/sys/unix"

// fdLimit returns the process's RLIMIT_NOFILE soft limit (which the Go
// runtime raises to the hard limit at start-up on Linux).
func fdLimit() (uint64, bool) {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil || l.Cur == unix.RLIM_INFINITY {
		return 0, false
	}
	return uint64(l.Cur), true
}
