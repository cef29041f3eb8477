package cidroute

import "time"

// hostScanInterval is how often the host's addresses are rescanned where
// no change notifications are available.
const hostScanInterval = 2 * time.Second

// scanHostAddrs calls changed at once and then every hostScanInterval
// until stop is closed: what changed since the last scan (or while a
// notification socket was failing) is not left for a whole period.
func scanHostAddrs(stop <-chan struct{}, changed func()) {
	changed()
	t := time.NewTicker(hostScanInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			changed()
		}
	}
}
