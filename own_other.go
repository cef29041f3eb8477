//go:build !linux

package cidroute

// watchHostAddrs rescans the host's addresses every hostScanInterval until
// stop is closed: only Linux has rtnetlink notifications.
func watchHostAddrs(stop <-chan struct{}, changed func()) { scanHostAddrs(stop, changed) }
