package proxyconfig

import (
	"fmt"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/health"
)

// fileHealthCheck is a service's "health_check" key: active probes through
// the backends' DTLS or QUIC stack (package health). Absent: no probes.
type fileHealthCheck struct {
	Interval string `json:"interval"` // default 2s
	Timeout  string `json:"timeout"`  // default 1s, at most the interval
	Jitter   string `json:"jitter"`   // default interval/5; "0s": none
	Fall     int    `json:"fall"`     // default 3
	Rise     int    `json:"rise"`     // default 2
}

// Lower bounds of the health_check durations: a probe per backend every
// 100 ms is already far more than any deployment needs.
const (
	minProbeInterval = 100 * time.Millisecond
	minProbeTimeout  = 10 * time.Millisecond
)

// parseHealthCheck applies "health_check" to s, whose protocol and mode
// are known: s.Health gets the checker's configuration with the defaults
// applied (no Logger: Build gives it the service's).
func parseHealthCheck(fh *fileHealthCheck, s *Service) error {
	if fh == nil {
		return nil
	}
	hc := health.Config{Service: s.Name, Fall: fh.Fall, Rise: fh.Rise,
		ProbeConfig: health.ProbeConfig{Protocol: cidroute.DTLS, Direct: s.Transparent}}
	if s.Protocol == cidroute.QUIC {
		hc.Protocol = cidroute.QUIC
	}
	var err error
	if hc.Interval, err = parseDuration("health_check.interval", fh.Interval, minProbeInterval, false); err != nil {
		return err
	}
	if hc.Timeout, err = parseDuration("health_check.timeout", fh.Timeout, minProbeTimeout, false); err != nil {
		return err
	}
	if fh.Jitter == "0s" {
		hc.Jitter = -1
	} else if hc.Jitter, err = parseDuration("health_check.jitter", fh.Jitter, time.Millisecond, false); err != nil {
		return err
	}
	if fh.Fall < 0 || fh.Rise < 0 {
		return fmt.Errorf("health_check: fall %d, rise %d: want 1 to 100 (0: the defaults 3 and 2)", fh.Fall, fh.Rise)
	}
	if hc, err = hc.WithDefaults(); err != nil {
		return fmt.Errorf("health_check: %w", err)
	}
	hc.Logger = nil
	s.Health = &hc
	return nil
}

// healthSummary is the health_check part of a service's summary line.
func healthSummary(hc *health.Config) string {
	if hc == nil {
		return ""
	}
	return fmt.Sprintf(", probes every %v (timeout %v, fall %d, rise %d)", hc.Interval, hc.Timeout, hc.Fall, hc.Rise)
}
