package cidroute

import "time"

// hostScanInterval is how often the host's addresses are rescanned where
// no change notifications are available.
const hostScanInterval = 2 * time.Second

// scanHostAddrs calls changed every hostScanInterval until stop is closed.
func scanHostAddrs(stop <-chan struct{}, changed func()) {
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
