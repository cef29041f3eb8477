// Package piondemo runs the cidroute demo (package demo) with pion/dtls v3
// sessions: PSK handshakes and encrypted records, the echo backends of
// dtlsecho behind the PPv2 adapter, and pion clients with connection IDs.
// `cidproxy -demo` runs it; `go run ./examples/demo` runs demo.Records,
// which compiles no TLS stack.
package piondemo

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/examples/internal/demo"
	"github.com/cidroute/cidroute/ppv2/backend"
)

var psk = []byte("cidroute demo key")

// Stack is the demo's pion/dtls v3 stack.
var Stack = demo.Stack{
	Sessions: "pion/dtls v3 with connection IDs (PSK, TLS_PSK_WITH_AES_128_CCM_8)",
	Backend:  listen,
	Client:   dial,
}

func listen(cfg demo.BackendConfig) (demo.Backend, error) {
	s, err := dtlsecho.Listen(dtlsecho.Config{
		Ordinal:          cfg.Ordinal,
		PSK:              psk,
		TrustedProxies:   cfg.TrustedProxies,
		Direct:           backend.DirectNoHandshake, // no client around the proxies
		Prefix:           cfg.Prefix,
		HandshakeTimeout: cfg.HandshakeTimeout,
		Logger:           cfg.Logger,
		Observe:          func(m dtlsecho.Message) { cfg.Observe(demo.Message{Session: m.Session, Data: m.Data}) },
	})
	if err != nil {
		return nil, err
	}
	return server{s}, nil
}

type server struct{ *dtlsecho.Server }

func (s server) Report() demo.BackendReport {
	st, dm := s.Stats()
	r := demo.BackendReport{Adapter: st, NoSession: dm.DroppedNoSession}
	for _, ss := range s.Sessions() {
		r.Sessions = append(r.Sessions, demo.Session{ID: ss.ID, First: ss.First, Last: ss.Last, Messages: ss.Messages, Moves: ss.Moves})
	}
	return r
}

func dial(ctx context.Context, sock *cidroutetest.RebindConn, id int) (demo.ClientConn, error) {
	// pion does not expose the CID it sends: the socket reads it from the
	// outgoing records.
	sock.WatchDTLSCID(cidroute.DefaultDTLSCIDLen)
	conn, err := pion.Client(sock, net.UDPAddrFromAddrPort(demo.Public), dtlsecho.PSKClientConfig(psk, fmt.Sprint("client-", id)))
	if err != nil {
		return nil, err
	}
	if err := conn.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return client{conn, sock}, nil
}

type client struct {
	conn *pion.Conn
	sock *cidroutetest.RebindConn
}

func (c client) Write(msg []byte) error {
	_, err := c.conn.Write(msg)
	return err
}

func (c client) Read(buf []byte, deadline time.Time) (int, error) {
	c.conn.SetReadDeadline(deadline)
	return c.conn.Read(buf)
}

func (c client) CID() []byte  { return c.sock.CID() }
func (c client) Close() error { return c.conn.Close() }

// Run runs the demo with pion/dtls v3 for about d (see demo.Run).
func Run(ctx context.Context, out io.Writer, log *slog.Logger, d time.Duration) error {
	return demo.Run(ctx, out, log, d, Stack)
}
