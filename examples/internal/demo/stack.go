package demo

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/cidroute/cidroute/cidroutetest"
	"github.com/cidroute/cidroute/ppv2/backend"
)

// A Stack is the DTLS code that the demo's backends and clients run.
// The proxies and the checks are the same whichever runs: Records
// (`go run ./examples/demo`) or piondemo.Stack (`cidproxy -demo`).
type Stack struct {
	// Sessions says what the sessions are, for the demo's header.
	Sessions string
	// Backend starts an echo server behind the PPv2 adapter.
	Backend func(BackendConfig) (Backend, error)
	// Client starts client id's session over sock (which sends to a
	// replica, and whose peer is Public); the handshake ends by ctx's
	// deadline.
	Client func(ctx context.Context, sock *cidroutetest.RebindConn, id int) (ClientConn, error)
}

// BackendConfig is what the demo asks of every backend.
type BackendConfig struct {
	// Ordinal goes into byte 0 of every CID the backend issues.
	Ordinal uint8
	// Prefix is prepended to every echo, so that a client sees who
	// answered.
	Prefix string
	// TrustedProxies are the replicas' networks.
	TrustedProxies []netip.Prefix
	// HandshakeTimeout bounds a handshake.
	HandshakeTimeout time.Duration
	// Logger receives warnings and errors.
	Logger *slog.Logger
	// Observe is called with every message before it is echoed.
	Observe func(Message)
}

// A Message is one application message a backend received; Data is valid
// only during the Observe call.
type Message struct {
	Session uint64 // the Session's ID
	Data    []byte
}

// A Backend is a running echo server.
type Backend interface {
	Ordinal() uint8
	Addr() netip.AddrPort
	Report() BackendReport
	Close() error
}

// BackendReport is what a backend saw.
type BackendReport struct {
	Adapter   backend.Stats // the PPv2 adapter's counters
	NoSession uint64        // records with a CID the backend has no session for
	Sessions  []Session     // in the order they started
}

// A Session is what a backend knows of one session.
type Session struct {
	ID          uint64       // numbers the backend's sessions from 1
	First, Last backend.Addr // the peer at the start and now
	Messages    int          // application messages received
	Moves       int          // how often the peer changed (client or proxy)
}

// A ClientConn is a client's session after its handshake.
type ClientConn interface {
	// Write sends one message.
	Write(msg []byte) error
	// Read waits until deadline for the next echo (a net.Error that
	// times out when none came).
	Read(buf []byte, deadline time.Time) (int, error)
	// CID is the connection ID the backend issued.
	CID() []byte
	Close() error
}
