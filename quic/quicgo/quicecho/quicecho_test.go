package quicecho

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/internal/testtool"
	cidquic "github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/shutdown"
)

// A direct client: the stream echoes, the connection is recorded and
// logged, every CID the server issued carries its ordinal, and Drain cuts
// the connection still open at its deadline.
func TestEchoAndDrain(t *testing.T) {
	var logs testtool.SyncBuffer
	srv, err := Listen(Config{Ordinal: 4, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock, err := cidroutetest.ListenRebind(srv.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sock.WatchQUICDCID(cidquic.LBDefaultLen)
	tr := &quic.Transport{Conn: sock}
	defer tr.Close()
	c, err := tr.Dial(ctx, net.UDPAddrFromAddrPort(srv.Addr()), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{DefaultALPN}}, &quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	if _, err := st.Write([]byte("pong")); err != nil { // a 1-RTT packet of its own
		t.Fatal(err)
	}
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	if ord, ok := (cidquic.LB{}).Ordinal(sock.DCID()); !ok || ord != 4 {
		t.Fatalf("the client sends to CID %x: ordinal %d, %v; want 4", sock.DCID(), ord, ok)
	}
	cs := srv.Connections()
	if len(cs) != 1 || !cs[0].Open || cs[0].Bytes != 8 || cs[0].First.Client != sock.Local() {
		t.Fatalf("connections %+v", cs)
	}
	if srv.Open() != 1 {
		t.Fatalf("open %d", srv.Open())
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	if cut := srv.Drain(dctx); cut != 1 {
		t.Fatalf("cut %d, want 1", cut)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "cut at the drain deadline") {
		if time.Now().After(deadline) {
			t.Fatalf("no drain line in\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), `msg="connection started"`) {
		t.Errorf("no start line in\n%s", logs.String())
	}
}

var _ shutdown.Drainer = (*Server)(nil)
