package lwm2m

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pion "github.com/pion/dtls/v3"
	coapdtls "github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/options"
	"github.com/plgd-dev/go-coap/v3/pkg/runner/periodic"
	"github.com/plgd-dev/go-coap/v3/udp"
	udpClient "github.com/plgd-dev/go-coap/v3/udp/client"

	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
)

// Errors of a Device's exchanges; test with errors.Is.
var (
	// ErrNotFound: the server answered an update with 4.04, it holds no
	// such registration (its lifetime ran out, or the server restarted).
	ErrNotFound = errors.New("lwm2m: registration not found")
	// ErrRejected: the server answered with another unexpected code.
	ErrRejected = errors.New("lwm2m: request rejected")
	// ErrNotObserved: no observation to notify.
	ErrNotObserved = errors.New("lwm2m: not observed")
)

// DeviceConfig configures a Device. Endpoint is required.
type DeviceConfig struct {
	Endpoint    string
	Lifetime    time.Duration // the registration's lt (0 = 60 s), whole seconds
	ObservePath string        // the observable resource (default "/3303/0/5700")
	// ACKTimeout and MaxRetransmit are the CoAP transmission parameters
	// (0 = RFC 7252's 2 s and 4).
	ACKTimeout    time.Duration
	MaxRetransmit int
	// Runner drives the retransmissions of all devices that share it
	// (nil: one per device, ticking every 200 ms).
	Runner periodic.Func
}

// A Device is the CoAP side of an LwM2M client on an established pion
// session: it registers, updates, and answers the server's observation
// with confirmable notifications. Its methods are safe for concurrent
// use, but a device sends one request at a time.
type Device struct {
	cfg  DeviceConfig
	cc   *udpClient.Conn
	span time.Duration

	mu    sync.Mutex
	loc   string
	token message.Token // of the server's observation
	seq   atomic.Uint32
	obsC  chan struct{} // closed when an observation arrives
}

// NewDevice starts CoAP on conn, which the Device owns from now on.
func NewDevice(conn *pion.Conn, cfg DeviceConfig) *Device {
	if cfg.Lifetime == 0 {
		cfg.Lifetime = time.Minute
	}
	if cfg.ObservePath == "" {
		cfg.ObservePath = "/3303/0/5700"
	}
	if cfg.ACKTimeout == 0 {
		cfg.ACKTimeout = 2 * time.Second
	}
	if cfg.MaxRetransmit == 0 {
		cfg.MaxRetransmit = 4
	}
	d := &Device{cfg: cfg, obsC: make(chan struct{})}
	d.span = time.Duration(float64(cfg.ACKTimeout)*1.5)*(1<<(cfg.MaxRetransmit+1)-1) + time.Second
	opts := []udp.Option{
		options.WithHandlerFunc(udpClient.HandlerFunc(d.handle)),
		options.WithErrors(func(error) {}),
		options.WithTransmission(1, cfg.ACKTimeout, uint32(cfg.MaxRetransmit)),
		options.WithCloseSocket(),
	}
	if cfg.Runner != nil {
		opts = append(opts, options.WithPeriodicRunner(cfg.Runner))
	} else {
		ctx, cancel := context.WithCancel(context.Background())
		opts = append(opts, options.WithPeriodicRunner(periodic.New(ctx.Done(), 200*time.Millisecond)))
		defer func() { d.cc.AddOnClose(cancel) }()
	}
	d.cc = coapdtls.Client(conn, opts...)
	return d
}

// ExchangeLifetime is how long one confirmable exchange may take before
// it is given up: the ACK timeout with the random factor, doubled on each
// of MaxRetransmit resends, plus a second.
func (d *Device) ExchangeLifetime() time.Duration { return d.span }

// Done is closed when the session ends (the server's close_notify, or
// Close).
func (d *Device) Done() <-chan struct{} { return d.cc.Done() }

// Close ends the session.
func (d *Device) Close() error { return d.cc.Close() }

// Observed is closed once the server observes the device.
func (d *Device) Observed() <-chan struct{} { return d.obsC }

// Register sends POST /rd?ep=…&lt=…&b=U with the device's objects in link
// format, and keeps the location the server answers with (2.01).
func (d *Device) Register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, d.span)
	defer cancel()
	body := bytes.NewReader([]byte(`</1/0>,</3/0>,</3303/0>`))
	resp, err := d.cc.Post(ctx, "/rd", message.AppLinkFormat, body,
		message.Option{ID: message.URIQuery, Value: []byte("ep=" + d.cfg.Endpoint)},
		message.Option{ID: message.URIQuery, Value: []byte("lt=" + strconv.Itoa(int(d.cfg.Lifetime/time.Second)))},
		message.Option{ID: message.URIQuery, Value: []byte("lwm2m=1.1")},
		message.Option{ID: message.URIQuery, Value: []byte("b=U")})
	if err != nil {
		return err
	}
	defer d.cc.ReleaseMessage(resp)
	if resp.Code() != codes.Created {
		return fmt.Errorf("register: %v: %w", resp.Code(), ErrRejected)
	}
	loc, err := resp.Options().LocationPath()
	if err != nil || !strings.HasPrefix(strings.TrimPrefix(loc, "/"), "rd/") {
		return fmt.Errorf("register: location %q: %w", loc, ErrRejected)
	}
	d.mu.Lock()
	d.loc = "/" + strings.TrimPrefix(loc, "/")
	d.mu.Unlock()
	return nil
}

// Update sends POST /rd/<id> (2.04); ErrNotFound when the server no longer
// has the registration.
func (d *Device) Update(ctx context.Context) error {
	return d.atLocation(ctx, "update", codes.Changed, func(ctx context.Context, loc string) (*pool.Message, error) {
		return d.cc.Post(ctx, loc, message.TextPlain, nil)
	})
}

// atLocation sends the request do makes to the registration's location
// and maps the answer: want is success, 4.04 ErrNotFound (as is having no
// location), anything else ErrRejected.
func (d *Device) atLocation(ctx context.Context, what string, want codes.Code, do func(context.Context, string) (*pool.Message, error)) error {
	d.mu.Lock()
	loc := d.loc
	d.mu.Unlock()
	if loc == "" {
		return ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, d.span)
	defer cancel()
	resp, err := do(ctx, loc)
	if err != nil {
		return err
	}
	defer d.cc.ReleaseMessage(resp)
	switch resp.Code() {
	case want:
		return nil
	case codes.NotFound:
		return ErrNotFound
	}
	return fmt.Errorf("%s: %v: %w", what, resp.Code(), ErrRejected)
}

// Notify sends the observed resource's next value as a confirmable
// notification and waits for its acknowledgement.
func (d *Device) Notify(ctx context.Context) error {
	d.mu.Lock()
	tok := d.token
	d.mu.Unlock()
	if tok == nil {
		return ErrNotObserved
	}
	ctx, cancel := context.WithTimeout(ctx, d.span)
	defer cancel()
	seq := d.seq.Add(1)
	m := d.cc.AcquireMessage(ctx)
	defer d.cc.ReleaseMessage(m)
	m.SetCode(codes.Content)
	m.SetToken(tok)
	m.SetObserve(seq)
	m.SetContentFormat(message.TextPlain)
	m.SetBody(bytes.NewReader([]byte(strconv.Itoa(20 + int(seq%10)))))
	m.SetType(message.Confirmable)
	return d.cc.WriteMessage(m)
}

func (d *Device) handle(w *rw, r *pool.Message) {
	path, _ := r.Options().Path()
	if r.Code() != codes.GET || "/"+strings.TrimPrefix(path, "/") != d.cfg.ObservePath {
		w.SetResponse(codes.NotFound, message.TextPlain, nil)
		return
	}
	obs, err := r.Observe()
	seq := d.seq.Load()
	w.SetResponse(codes.Content, message.TextPlain, bytes.NewReader([]byte(strconv.Itoa(20+int(seq%10)))))
	if err == nil && obs == 0 {
		w.Message().SetObserve(seq)
		d.mu.Lock()
		first := d.token == nil
		d.token = append(message.Token(nil), r.Token()...)
		d.mu.Unlock()
		if first {
			close(d.obsC)
		}
	}
}

// ClientConfig is the pion configuration of a device of a Server: PSK
// with identity, and connection ID support (sending the server's CIDs,
// asking for none), as RFC 9146 devices behind NAT use it; the same as a
// dtlsecho client's.
func ClientConfig(psk []byte, identity string) *pion.Config {
	return dtlsecho.PSKClientConfig(psk, identity)
}

// Deregister sends DELETE /rd/<id> (2.02). The location is kept, so that
// a later Update is answered 4.04.
func (d *Device) Deregister(ctx context.Context) error {
	return d.atLocation(ctx, "deregister", codes.Deleted, func(ctx context.Context, loc string) (*pool.Message, error) {
		return d.cc.Delete(ctx, loc)
	})
}
