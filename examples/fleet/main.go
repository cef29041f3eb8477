// Command fleet runs an LwM2M-shaped fleet through cidroute on this
// machine and prints what it measured: three LwM2M registration servers
// (CoAP over DTLS 1.2 with connection IDs, on the PPv2 adapter) behind
// two cidproxy replicas, and N devices that register, update at a
// fraction of their lifetime, answer the server's observation with
// confirmable notifications, and sleep, waking on a new source port.
//
//	go run ./examples/fleet -devices 1000
//	go run ./examples/fleet -devices 1000 -disrupt server-restart
//	go run ./examples/fleet -devices 1000 -disrupt server-kill
//	go run ./examples/fleet -devices 1000 -disrupt proxy-restart
//	go run ./examples/fleet -devices 1000 -disrupt proxy-kill
//
// It exits 1 when a steady run (no -disrupt) lost a registration, a
// notification, or a session across sleep and rebinding. docs/fleet.md
// has the measured tables.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cidroute/cidroute/examples/internal/fleet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg fleet.Config
	fs.IntVar(&cfg.Devices, "devices", 1000, "number of devices")
	fs.IntVar(&cfg.Servers, "servers", 3, "LwM2M server replicas")
	fs.IntVar(&cfg.Proxies, "proxies", 2, "cidproxy replicas")
	fs.DurationVar(&cfg.Duration, "duration", 2*time.Minute, "how long to run after the last device started")
	fs.DurationVar(&cfg.Lifetime, "lifetime", time.Minute, "registration lifetime (lt)")
	fs.Float64Var(&cfg.UpdateFraction, "update-fraction", 0.5, "update after this fraction of the lifetime; a device sleeps in between")
	fs.BoolVar(&cfg.NoRebind, "no-rebind", false, "keep the source port across sleeps (default: a new one on every wake, a NAT rebinding)")
	fs.BoolVar(&cfg.RebindOnSleep, "rebind-on-sleep", false, "take the new port when falling asleep, not on waking: what the server sends to a sleeping device is lost (radio off)")
	fs.Float64Var(&cfg.Ramp, "ramp", 200, "devices started per second")
	fs.DurationVar(&cfg.ACKTimeout, "ack-timeout", 2*time.Second, "CoAP ACK_TIMEOUT (RFC 7252: 2s)")
	fs.IntVar(&cfg.MaxRetransmit, "max-retransmit", 4, "CoAP MAX_RETRANSMIT (RFC 7252: 4)")
	fs.DurationVar(&cfg.HandshakeTimeout, "handshake-timeout", 15*time.Second, "DTLS handshake timeout")
	fs.DurationVar(&cfg.RouteIdle, "route-idle", 0, "the servers' PPv2 route lifetime (0: the adapter's default, 5m)")
	dis := fs.String("disrupt", "", "disruption in the middle of the run: server-restart (drained), server-kill (crashed), proxy-restart or proxy-kill")
	fs.DurationVar(&cfg.DisruptAt, "disrupt-at", 0, "when the disruption starts, after the last device started (0: a third of -duration)")
	fs.DurationVar(&cfg.DrainTimeout, "drain", 2*time.Second, "a restarted server's drain: then its sessions are closed with close_notify")
	fs.DurationVar(&cfg.Pause, "pause", 5*time.Second, "between two replicas' restarts")
	fs.DurationVar(&cfg.LBDetect, "lb-detect", 2*time.Second, "how long the load balancer takes to take a killed proxy replica out")
	fs.DurationVar(&cfg.ProgressEvery, "progress", 5*time.Second, "progress line interval")
	connect := fs.String("connect", "", "comma-separated `addresses` of proxy replicas already running (see memory.sh): start only the devices")
	statsURLs := fs.String("server-stats", "", "comma-separated lwm2m-server /stats `URLs`, with -connect")
	rssPIDs := fs.String("rss-pids", "", "comma-separated `pids` whose RSS is sampled before the devices start and at the end (Linux)")
	quiet := fs.Bool("quiet", false, "no progress lines")
	logs := fs.Bool("v", false, "the proxies' warnings on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg.Disruption = fleet.Disruption(*dis)
	for _, a := range split(*connect) {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			fmt.Fprintf(stderr, "fleet: -connect: %v\n", err)
			return 2
		}
		cfg.Connect = append(cfg.Connect, ap)
	}
	cfg.ServerStats = split(*statsURLs)
	for _, p := range split(*rssPIDs) {
		pid, err := strconv.Atoi(p)
		if err != nil {
			fmt.Fprintf(stderr, "fleet: -rss-pids: %v\n", err)
			return 2
		}
		cfg.RSSPIDs = append(cfg.RSSPIDs, pid)
	}
	if !*quiet {
		cfg.Progress = stdout
	}
	if *logs {
		cfg.Log = stderr
	}
	fmt.Fprintf(stdout, "fleet: %d devices, %d servers, %d proxies, %d CPUs; starting %.0f devices/s\n", cfg.Devices, cfg.Servers, cfg.Proxies, runtime.NumCPU(), cfg.Ramp)
	res, err := fleet.Run(ctx, cfg)
	if res != nil {
		res.Print(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fleet: %v\n", err)
		return 1
	}
	if cfg.Disruption == fleet.None {
		if p := res.Problems(); len(p) > 0 {
			fmt.Fprintln(stdout, "\nresult: FAILED")
			for _, l := range p {
				fmt.Fprintln(stdout, "  -", l)
			}
			return 1
		}
		fmt.Fprintln(stdout, "\nresult: ok: every device registered, no registration or notification lost, every session survived sleep and rebinding")
	}
	return 0
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}
