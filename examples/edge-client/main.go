// Command edge-client is a pion/dtls v3 client (PSK, with connection IDs)
// that reaches a DTLS service through several cidroute edges and keeps its
// session on the best one, with package edge and piondtls.EdgeDialer. It
// sends a message every -every, prints each echo with the edge it came
// through, and logs the ranking and every switch. Stop the edge it uses
// and the session goes on through another, without a new handshake.
//
//	edge-client -edges 127.0.0.1:5684,127.0.0.1:5686 -psk 736563726574
//	edge-client -name edges.example.net:5684 -psk 736563726574 -state /var/lib/agent/edges.json
//
// With -name the edges are the name's addresses, resolved again through
// the system resolver in every watch round. SIGINT or SIGTERM stops it.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/dtls/piondtls"
	"github.com/cidroute/cidroute/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("edge-client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "", "`host:port` whose addresses are the edges (system resolver)")
	edges := fs.String("edges", "", "comma-separated edge `addresses` (instead of -name)")
	psk := fs.String("psk", "", "pre-shared key in `hex`")
	identity := fs.String("identity", "edge-client", "PSK identity")
	state := fs.String("state", "", "`file` keeping the ranking across restarts")
	every := fs.Duration("every", time.Second, "time between messages")
	count := fs.Int("count", 0, "messages to send (0: until stopped)")
	wait := fs.Duration("wait", 2*time.Second, "how long to wait for each echo")
	silence := fs.Duration("silence", 3*time.Second, "fail over after this long without an answer from the edge")
	interval := fs.Duration("interval", 5*time.Minute, "watch round period (full jitter) while not on the best edge")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	key, err := hex.DecodeString(*psk)
	resolve, rerr := resolver(*name, *edges)
	if err != nil || len(key) == 0 || rerr != nil {
		fmt.Fprintln(stderr, "edge-client: need -psk (hex) and one of -name or -edges:", errors.Join(err, rerr))
		return 2
	}
	cfg := piondtls.EdgeConfig{
		DTLS: &dtls.Config{
			PSK:                   func([]byte) ([]byte, error) { return key, nil },
			PSKIdentityHint:       []byte(*identity),
			CipherSuites:          []dtls.CipherSuiteID{dtls.TLS_PSK_WITH_AES_128_CCM_8},
			ConnectionIDGenerator: dtls.OnlySendCIDGenerator(),
			ExtendedMasterSecret:  dtls.RequestExtendedMasterSecret,
		},
		Silence: *silence,
		Edge: edge.Config{Resolve: resolve, Interval: *interval, Logger: log, OnEvent: func(e edge.Event) {
			if e.Kind == edge.EventRanked {
				var order []string
				for _, en := range e.Ranking.Entries {
					if en.OK {
						order = append(order, fmt.Sprintf("%v(%v)", en.Addr, en.Sample.RTT.Round(100*time.Microsecond)))
					} else {
						order = append(order, en.Addr.String()+"(failed)")
					}
				}
				log.Info("edges ranked", "order", strings.Join(order, " "))
			}
		}},
	}
	if *state != "" {
		cfg.Edge.Store = edge.FileStore(*state)
	}
	d, err := piondtls.NewEdgeDialer(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "edge-client:", err)
		return 2
	}
	c, err := d.Dial(ctx)
	if err != nil {
		log.Error("no edge answered", "err", err)
		return 1
	}
	defer c.Close()
	log.Info("session up", "edge", c.Edge())

	buf := make([]byte, 2048)
	answered := false
	for i := 1; *count == 0 || i <= *count; i++ {
		msg := fmt.Sprint("hello ", i)
		if _, err := c.Write([]byte(msg)); err != nil {
			log.Error("write failed", "err", err)
			return 1
		}
		answered = false
		c.SetReadDeadline(time.Now().Add(*wait))
		for !answered {
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				fmt.Fprintf(stdout, "%s: no answer\n", msg)
				break
			}
			if err != nil {
				log.Error("session ended", "err", err)
				return 1
			}
			// Answers to messages that timed out may still come in.
			if got := string(buf[:n]); strings.HasSuffix(got, msg) {
				fmt.Fprintf(stdout, "%s: %q via %v\n", msg, got, c.Edge())
				answered = true
			}
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*every):
		}
	}
	st := d.Chooser().Stats()
	log.Info("done", "switches", st.SwitchesTotal(), "probes", st.Probes, "silences", c.Stats().Silences)
	if !answered {
		return 1
	}
	return 0
}

func resolver(name, list string) (edge.ResolveFunc, error) {
	switch {
	case name != "" && list == "":
		host, port, err := net.SplitHostPort(name)
		if err != nil {
			return nil, err
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, err
		}
		return edge.LookupHost(host, uint16(p)), nil
	case list != "" && name == "":
		var addrs []netip.AddrPort
		for _, s := range strings.Split(list, ",") {
			a, err := netip.ParseAddrPort(strings.TrimSpace(s))
			if err != nil {
				return nil, err
			}
			addrs = append(addrs, a)
		}
		return edge.Static(addrs...), nil
	}
	return nil, errors.New("exactly one of -name and -edges")
}
