package proxyconfig

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
)

func TestHealthCheckConfig(t *testing.T) {
	parse := func(hc string) (*Config, error) {
		return Parse(strings.NewReader(withServices(`{` + svc + `, "health_check": ` + hc + `}`)))
	}
	c, err := parse(`{}`)
	require.NoError(t, err)
	h := c.Services[0].Health
	require.NotNil(t, h)
	assert.Equal(t, cidroute.DTLS, h.Protocol)
	assert.False(t, h.Direct)
	assert.Equal(t, [4]any{2 * time.Second, time.Second, 3, 2}, [4]any{h.Interval, h.Timeout, h.Fall, h.Rise})
	assert.Contains(t, c.Summary(), "probes every 2s (timeout 1s, fall 3, rise 2)")

	c, err = parse(`{"interval": "500ms", "timeout": "200ms", "jitter": "0s", "fall": 5, "rise": 1}`)
	require.NoError(t, err)
	h = c.Services[0].Health
	assert.Equal(t, [5]any{500 * time.Millisecond, 200 * time.Millisecond, time.Duration(0), 5, 1}, [5]any{h.Interval, h.Timeout, h.Jitter, h.Fall, h.Rise})

	c, err = Parse(strings.NewReader(withServices(`{"name": "q", "protocol": "quic", "listen": "127.0.0.1:443", "proxy_protocol": false,
		"backends_file": "b.json", "health_check": {"interval": "1s"}}`)))
	require.NoError(t, err)
	h = c.Services[0].Health
	assert.Equal(t, cidroute.QUIC, h.Protocol)
	assert.True(t, h.Direct, "transparent mode: no PPv2 header on the probe")
	assert.Equal(t, 200*time.Millisecond, h.Jitter)

	c, err = Parse(strings.NewReader(withServices(`{` + svc + `}`)))
	require.NoError(t, err)
	assert.Nil(t, c.Services[0].Health, "no key, no probes")

	for hc, want := range map[string]string{
		`{"interval": "10ms"}`:                 "health_check.interval",
		`{"interval": "1s", "timeout": "2s"}`:  `health_check.timeout: "2s" is longer than the interval, 1s`,
		`{"timeout": "1ms"}`:                   "health_check.timeout",
		`{"interval": "1s", "jitter": "1s"}`:   `health_check.jitter: "1s" is not less than the interval, 1s`,
		`{"fall": -1}`:                         "health_check.fall: -1 is out of range; write 1-100 (default 3)",
		`{"fall": 0}`:                          "health_check.fall: 0 is out of range; write 1-100 (default 3)",
		`{"rise": 101}`:                        "health_check.rise: 101 is out of range; write 1-100 (default 2)",
		`{"interva": "1s"}`:                    `health_check.interva: unknown key; did you mean "interval"?`,
		`{"interval": "1s", "Interval": "2s"}`: "Interval",
		`{"interval": 1}`:                      "interval",
		`true`:                                 "health_check",
	} {
		_, err := parse(hc)
		assert.ErrorContains(t, err, want, hc)
	}
}

// Registries.Run runs the service's health checker: a backend whose port
// is closed (ICMP port unreachable) is marked down in its registry, the
// change is logged once, and Registries.Checker gives the checker's view.
// A service without health_check has no checker.
func TestRegistriesRunHealthChecker(t *testing.T) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	closed := c.LocalAddr().String()
	c.Close()
	cfg := mustParse(t, `{"services": [{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:5684",
		"backends": [{"ordinal": 0, "address": "`+closed+`"}], "health_check": {"interval": "100ms", "timeout": "50ms"}},
		{"name": "q", "protocol": "quic", "listen": "127.0.0.1:443", "backends": [{"ordinal": 0, "address": "`+closed+`"}]}]}`)
	var logs syncBuffer
	regs, err := cfg.Build(Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	defer regs.Close()
	_, ok := regs.Checker("q")
	assert.False(t, ok)
	ch, ok := regs.Checker("d")
	require.True(t, ok)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { regs.Run(ctx); close(done) }()
	reg, _ := regs.Registry("d")
	require.Eventually(t, func() bool { return reg.Snapshot().Down(0) }, 5*time.Second, 10*time.Millisecond)
	cancel()
	<-done
	st := ch.Stats()
	require.Len(t, st.Backends, 1)
	assert.False(t, st.Backends[0].Up)
	assert.Positive(t, st.Backends[0].Results[health.Refused])
	assert.Equal(t, 1, strings.Count(logs.String(), "backend down"), logs.String())
	assert.Contains(t, logs.String(), "service=d")
	q, _ := regs.Registry("q")
	assert.False(t, q.Snapshot().Down(0), "no probes without health_check")
}

// Issue 35: the marks belong to the checker. A backend marked down that
// the source then drains keeps its mark quietly; when health_check is
// removed, every mark the checker set goes with it, the draining
// backend's too, so that it takes new sessions once the source makes it
// ready again (before the fix it stayed down for good, with nothing left
// to probe it).
func TestHealthRemovedLiftsEveryMark(t *testing.T) {
	dead := func() string {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		require.NoError(t, err)
		defer c.Close()
		return c.LocalAddr().String()
	}
	a0, a1 := dead(), dead()
	conf := func(state1, hc string) *Config {
		return mustParse(t, `{"services": [{"name": "d", "protocol": "dtls", "listen": "127.0.0.1:5684",
			"backends": [{"ordinal": 0, "address": "`+a0+`"}, {"ordinal": 1, "address": "`+a1+`", "state": "`+state1+`"}]`+hc+`}]}`)
	}
	const hc = `, "health_check": {"interval": "100ms", "timeout": "50ms", "fall": 1}`
	base := conf("ready", hc)
	o := Options{Logger: slog.New(slog.DiscardHandler)}
	regs, err := base.Build(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); regs.Run(ctx) }()
	defer func() { cancel(); <-ran; regs.Close() }()
	reg, _ := regs.Registry("d")
	require.Eventually(t, func() bool { return reg.Stats().Down == 2 }, 5*time.Second, 5*time.Millisecond, "both ports are closed")

	apply := func(next *Config) {
		t.Helper()
		d := base.Diff(next)
		require.NoError(t, regs.Apply(d, o))
		base = d.Effective
	}
	apply(conf("draining", hc)) // the source drains 1: its mark waits
	st := reg.Stats()
	assert.Equal(t, [2]int{1, 1}, [2]int{st.Down, st.Draining})
	apply(conf("draining", "")) // no more health checks
	assert.Zero(t, reg.Stats().Down, "the ready backend's mark is lifted")
	apply(conf("ready", "")) // 1 is back
	st = reg.Stats()
	assert.Equal(t, [2]int{2, 0}, [2]int{st.Ready, st.Down}, "no mark outlives its checker, whatever the backend's state was")
}
