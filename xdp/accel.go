//go:build linux

package xdp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cidroute/cidroute"
)

// An Accel is the program serving a running Pipeline's services on some
// interfaces: what cidproxy's "xdp_interfaces" key starts.
type Accel struct {
	prog *Program
}

// Accelerate loads the program, gives it every service of the pipeline
// (built from services, with maxDatagram as Config.MaxDatagram) and
// attaches it to each interface, natively where the driver can, and logs
// the mode. Run keeps its snapshots current; Close detaches it.
func Accelerate(pipe *cidroute.Pipeline, services []cidroute.Service, maxDatagram int, interfaces []string, log *slog.Logger) (*Accel, error) {
	if len(interfaces) == 0 {
		return nil, errors.New("xdp: no interfaces")
	}
	p, err := Load(Options{Logger: log})
	if err != nil {
		return nil, err
	}
	for _, sc := range services {
		s, err := ServiceOf(pipe, sc, maxDatagram)
		if err == nil {
			err = p.AddService(s)
		}
		if err != nil {
			p.Close()
			return nil, err
		}
		if s.Pass {
			p.log.Info("xdp: the service's datagrams go up to the pipeline (limits, transparent mode, or a codec, classifier or encoder the program lacks)", "service", s.Name)
		}
	}
	for _, ifname := range interfaces {
		if _, err := p.Attach(ifname); err != nil {
			p.Close()
			return nil, err
		}
	}
	return &Accel{prog: p}, nil
}

// Run keeps the program's snapshots current until ctx is done.
func (a *Accel) Run(ctx context.Context) error { return a.prog.Run(ctx) }

// Close detaches the program and frees it.
func (a *Accel) Close() error { return a.prog.Close() }

// Stats returns the datagrams the program decided, per service, in the
// pipeline's terms: the pipeline counts those it handed up itself, so the
// two add up to every datagram, each counted once.
func (a *Accel) Stats() []cidroute.ServiceStats {
	st, err := a.prog.Stats()
	if err != nil {
		a.prog.log.Error("xdp: reading counters", "err", err)
		return nil
	}
	out := make([]cidroute.ServiceStats, len(st))
	for i, s := range st {
		out[i] = cidroute.ServiceStats{Name: s.Name, Forward: s.Forward.Counters, Reverse: s.Reverse.Counters}
	}
	return out
}

// Program returns the loaded program, for its per-path counters (Passed).
func (a *Accel) Program() *Program { return a.prog }

// String describes the attachment, for logs.
func (a *Accel) String() string { return fmt.Sprintf("xdp on %d interfaces", len(a.prog.links)) }
