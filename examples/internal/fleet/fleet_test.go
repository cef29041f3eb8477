package fleet

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// TestSteadyFleet runs the whole topology (three LwM2M servers, two
// cidproxy replicas, devices that sleep and wake on a new port) and fails
// if a registration is lost or a session does not survive sleep and
// rebinding.
func TestSteadyFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a fleet for about 20 s")
	}
	res, err := Run(context.Background(), Config{
		Devices:  30,
		Duration: 12 * time.Second,
		Lifetime: 8 * time.Second, // a wake every 4 s: three per device
		Ramp:     30,
		// Short CoAP timers, so that a lost exchange shows within the run.
		ACKTimeout:    500 * time.Millisecond,
		MaxRetransmit: 3,
		// A handshake whose cookie exchange straddled a health-probe
		// change on a loaded machine is abandoned and tried again within
		// the run (docs/design.md, the one-round-trip window).
		HandshakeTimeout: 5 * time.Second,
		Progress:         testWriter{t},
		Log:              os.Stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	res.Print(&b)
	t.Log(b.String())
	if p := res.Problems(); len(p) > 0 {
		t.Fatal(problems(p))
	}
	if res.Wakes < uint64(2*res.Devices) {
		t.Fatalf("%d wakes with a rebinding for %d devices: want at least 2 each", res.Wakes, res.Devices)
	}
	var notifs uint64
	for _, s := range res.Servers {
		notifs += s.Notifications
	}
	if notifs < res.NotifAcked {
		t.Fatalf("the servers counted %d notifications, the devices %d acknowledged", notifs, res.NotifAcked)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}
