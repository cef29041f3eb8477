package fleet

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// quantile returns the q-quantile of sorted (0 when empty).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	case d < 10*time.Second:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func pct(n, of uint64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d (%.2f%%)", n, of, 100*float64(n)/float64(of))
}

// Print writes the summary table.
func (r *Result) Print(w io.Writer) {
	cfg := r.Config
	dis := string(cfg.Disruption)
	if dis == "" {
		dis = "none (steady state)"
	}
	rebind := "on waking"
	switch {
	case cfg.NoRebind:
		rebind = "none"
	case cfg.RebindOnSleep:
		rebind = "on falling asleep (radio off)"
	}
	fmt.Fprintf(w, "\nfleet: %d devices, %d LwM2M servers behind %d cidproxy replicas; lifetime %v, update every %v, new port: %s\n",
		r.Devices, cfg.Servers, cfg.Proxies, cfg.Lifetime, time.Duration(float64(cfg.Lifetime)*cfg.UpdateFraction), rebind)
	fmt.Fprintf(w, "ran %.0f s (devices started over %.0f s); CoAP ACK_TIMEOUT %v, MAX_RETRANSMIT %d; disruption: %s\n",
		r.Elapsed.Seconds(), r.Started.Seconds(), cfg.ACKTimeout, cfg.MaxRetransmit, dis)
	for _, l := range r.Disrupted {
		fmt.Fprintln(w, "  ", l)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	fmt.Fprintln(tw, "\n  measure\tvalue")
	row("registration success (devices registered at least once)", pct(r.FirstRegistered, uint64(r.Devices)))
	row("registered at the end", fmt.Sprintf("%d/%d", r.Registered, r.Devices))
	row("registrations (2.01) / failed", fmt.Sprintf("%d / %d", r.Registrations, r.RegFailed))
	row("register round trip p50 / p99", ms(quantile(r.RegisterRTT, .5))+" / "+ms(quantile(r.RegisterRTT, .99)))
	row("updates answered 2.04", fmt.Sprint(r.Updates))
	row("update round trip p50 / p99 / max", ms(quantile(r.UpdateRTT, .5))+" / "+ms(quantile(r.UpdateRTT, .99))+" / "+ms(quantile(r.UpdateRTT, 1)))
	row("lost registrations (update 4.04 / unanswered / session ended by server)", fmt.Sprintf("%d / %d / %d", r.UpdNotFound, r.UpdFailed, r.ClosedByServer))
	row("sessions that survived sleep + rebinding", pct(r.Survived, r.Wakes))
	row("confirmable notifications acknowledged", pct(r.NotifAcked, r.NotifSent))
	row("notifications lost (no ACK) / no observation", fmt.Sprintf("%d / %d", r.NotifLost, r.NotObserved))
	row("recovery: devices registered again", fmt.Sprint(len(r.Recovery)))
	row("recovery time p50 / p99 / max", ms(quantile(r.Recovery, .5))+" / "+ms(quantile(r.Recovery, .99))+" / "+ms(quantile(r.Recovery, 1)))
	row("handshakes completed / failed", fmt.Sprintf("%d / %d", r.Handshakes, r.HandshakesFailed))
	row("datagrams through the proxies (device side)", fmt.Sprintf("%d, %.0f/s", r.Sent+r.Received, float64(r.Sent+r.Received)/r.Elapsed.Seconds()))
	tw.Flush()

	fmt.Fprintln(tw, "\n  server\tsessions at the end\tregistrations (again)\tupdates (4.04)\texpired\tnotifications\tduplicates\tno-session records\tforeign hellos\tcut by drain")
	for _, s := range r.Servers {
		fmt.Fprintf(tw, "  %d\t%d\t%d (%d)\t%d (%d)\t%d\t%d\t%d\t%d\t%d\t%d\n", s.Ordinal, s.Sessions, s.Registrations, s.ReRegistrations,
			s.Updates, s.UpdatesUnknown, s.Expired, s.Notifications, s.Duplicates, s.DroppedNoSess, s.DroppedForeign, s.Cut)
	}
	tw.Flush()
	if len(r.RSS) > 0 {
		fmt.Fprintf(tw, "\n  process\tRSS before\tRSS with %d registered devices\tbytes per device\n", r.Registered)
		for _, m := range r.RSS {
			per := "-"
			if r.Registered > 0 {
				per = fmt.Sprint((m.After - m.Before) / r.Registered)
			}
			fmt.Fprintf(tw, "  %s (pid %d)\t%.1f MiB\t%.1f MiB\t%s\n", m.Name, m.PID, float64(m.Before)/(1<<20), float64(m.After)/(1<<20), per)
		}
		tw.Flush()
	}
}

// Problems lists what a steady run must not show: a device that never
// registered, a registration lost, a session that did not survive sleep
// and rebinding, a notification lost.
func (r *Result) Problems() []string {
	var p []string
	if r.FirstRegistered != uint64(r.Devices) {
		p = append(p, fmt.Sprintf("%d of %d devices registered", r.FirstRegistered, r.Devices))
	}
	if r.UpdNotFound+r.UpdFailed+r.ClosedByServer > 0 {
		p = append(p, fmt.Sprintf("registrations lost: %d updates answered 4.04, %d unanswered, %d sessions ended by a server", r.UpdNotFound, r.UpdFailed, r.ClosedByServer))
	}
	if r.Survived != r.Wakes {
		p = append(p, fmt.Sprintf("%d of %d sessions survived sleep and rebinding", r.Survived, r.Wakes))
	}
	if r.NotifLost > 0 {
		p = append(p, fmt.Sprintf("%d notifications lost", r.NotifLost))
	}
	return p
}

// problems joins Problems on one line.
func problems(p []string) string { return strings.Join(p, "; ") }
