package lwm2m

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	pion "github.com/pion/dtls/v3"

	"github.com/cidroute/cidroute/ppv2/backend"
)

var testPSK = []byte("lwm2m test key")

// dial connects a device straight to s (no proxy: the server accepts
// direct datagrams).
func dial(t *testing.T, s *Server, cfg DeviceConfig) *Device {
	t.Helper()
	udp, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	raddr := net.UDPAddrFromAddrPort(s.Addr())
	c, err := pion.Client(udp, raddr, ClientConfig(testPSK, cfg.Endpoint))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		t.Fatal(err)
	}
	d := NewDevice(c, cfg)
	t.Cleanup(func() { d.Close() })
	return d
}

func TestRegisterUpdateObserve(t *testing.T) {
	s, err := Listen(ServerConfig{PSK: testPSK, Direct: backend.DirectAccept, ACKTimeout: 500 * time.Millisecond, MaxRetransmit: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := dial(t, s, DeviceConfig{Endpoint: "dev-1", Lifetime: 2 * time.Second, ACKTimeout: 500 * time.Millisecond, MaxRetransmit: 2})
	ctx := context.Background()
	if err := d.Notify(ctx); !errors.Is(err, ErrNotObserved) {
		t.Fatalf("notify before any observation: %v, want ErrNotObserved", err)
	}
	if err := d.Register(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Observed():
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not observe the device")
	}
	for range 3 {
		if err := d.Update(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Notify(ctx); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	if st.Registrations != 1 || st.Updates != 3 || st.Notifications != 3 || st.Observations != 1 || st.Registered != 1 {
		t.Fatalf("stats %+v: want 1 registration, 3 updates, 3 notifications, 1 observation", st)
	}
	if err := d.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Update(ctx); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update after de-registration: %v, want ErrNotFound", err)
	}
	if st := s.Stats(); st.Deregistrations != 1 || st.UpdatesUnknown != 1 || st.Registered != 0 {
		t.Fatalf("stats %+v: want 1 de-registration, 1 unknown update, none registered", st)
	}
}

// TestLifetimeExpiry: a registration not updated within its lifetime is
// removed, and its session with it (a vanished device holds no memory).
func TestLifetimeExpiry(t *testing.T) {
	s, err := Listen(ServerConfig{PSK: testPSK, Direct: backend.DirectAccept})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := dial(t, s, DeviceConfig{Endpoint: "dev-2", Lifetime: time.Second})
	if err := d.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its registration's lifetime")
	}
	if st := s.Stats(); st.Expired != 1 || st.Registered != 0 {
		t.Fatalf("stats %+v: want 1 expired, none registered", st)
	}
}

// TestQueueModeSilence: a device silent for longer than go-coap's default
// DTLS server inactivity timeout (16 s) keeps its session, as a
// queue-mode device that sleeps for minutes must.
func TestQueueModeSilence(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps 18 s")
	}
	s, err := Listen(ServerConfig{PSK: testPSK, Direct: backend.DirectAccept})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := dial(t, s, DeviceConfig{Endpoint: "dev-3", Lifetime: time.Minute})
	if err := d.Register(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
		t.Fatal("the server ended a silent device's session")
	case <-time.After(18 * time.Second):
	}
	if err := d.Update(context.Background()); err != nil {
		t.Fatalf("update after 18 s of silence: %v", err)
	}
}

// TestKill: a killed server sends no close_notify; its device learns of
// it when an update goes unanswered, where a closed one's learns at once.
func TestKill(t *testing.T) {
	for _, kill := range []bool{false, true} {
		s, err := Listen(ServerConfig{PSK: testPSK, Direct: backend.DirectAccept})
		if err != nil {
			t.Fatal(err)
		}
		d := dial(t, s, DeviceConfig{Endpoint: "dev-4", ACKTimeout: 200 * time.Millisecond, MaxRetransmit: 1})
		if err := d.Register(context.Background()); err != nil {
			t.Fatal(err)
		}
		if kill {
			s.Kill()
		} else {
			s.Close()
		}
		select {
		case <-d.Done():
			if kill {
				t.Fatal("a killed server's device saw its session end")
			}
		case <-time.After(2 * time.Second):
			if !kill {
				t.Fatal("a closed server's device did not see close_notify")
			}
		}
		if kill {
			if err := d.Update(context.Background()); err == nil {
				t.Fatal("an update to a killed server was answered")
			}
		}
	}
}
