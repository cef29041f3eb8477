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
	maxFallRise      = 100
)

// parseHealthCheck applies the "health_check" at path to s, whose
// protocol and mode are known: s.Health gets the checker's configuration
// with the defaults applied (no Logger: Build gives it the service's).
func parseHealthCheck(src *source, path string, fh *fileHealthCheck, s *Service) error {
	if fh == nil {
		return nil
	}
	at := func(key string) string { return path + "." + key }
	hc := health.Config{Service: s.Name, Fall: fh.Fall, Rise: fh.Rise,
		ProbeConfig: health.ProbeConfig{Protocol: cidroute.DTLS, Direct: s.Transparent}}
	if s.Protocol == cidroute.QUIC {
		hc.Protocol = cidroute.QUIC
	}
	var err error
	if hc.Interval, err = parseDuration(src, at("interval"), fh.Interval, minProbeInterval, false); err != nil {
		return err
	}
	if hc.Timeout, err = parseDuration(src, at("timeout"), fh.Timeout, minProbeTimeout, false); err != nil {
		return err
	}
	if fh.Jitter == "0s" {
		hc.Jitter = -1
	} else if hc.Jitter, err = parseDuration(src, at("jitter"), fh.Jitter, time.Millisecond, false); err != nil {
		return err
	}
	interval := hc.Interval
	if interval == 0 {
		interval = health.DefaultInterval
	}
	switch {
	case hc.Timeout > interval:
		return src.err(at("timeout"), fmt.Sprintf("%q is longer than the interval, %v", fh.Timeout, interval), "write "+want(at("timeout")))
	case hc.Jitter >= interval:
		return src.err(at("jitter"), fmt.Sprintf("%q is not less than the interval, %v", fh.Jitter, interval), "write "+want(at("jitter")))
	}
	for _, v := range []struct {
		key string
		n   int
	}{{"fall", fh.Fall}, {"rise", fh.Rise}} {
		if src.has(at(v.key)) && (v.n < 1 || v.n > maxFallRise) {
			return src.err(at(v.key), fmt.Sprintf("%d is out of range", v.n), "write "+want(at(v.key)))
		}
	}
	if hc, err = hc.WithDefaults(); err != nil { // the bounds above are these
		return src.wrap(path, err, err.Error(), "")
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
