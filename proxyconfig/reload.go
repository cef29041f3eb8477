package proxyconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/registry"
)

// A Refusal is a key whose new value a running program cannot apply
// without new sockets or a new pipeline: a restart handover applies it.
type Refusal struct {
	Service string // "" for a top-level key
	Key     string // "" when the whole service was removed from the file
}

// String names the key as the file does: "hrw_seed",
// `services["coaps"].listen`, `services["coaps"] (removed)`.
func (r Refusal) String() string {
	switch {
	case r.Service == "":
		return r.Key
	case r.Key == "":
		return fmt.Sprintf("services[%q] (removed)", r.Service)
	}
	return fmt.Sprintf("services[%q].%s", r.Service, r.Key)
}

// A ServiceDelta is what a reload changes in one service.
type ServiceDelta struct {
	Name  string // the service's
	Added bool   // a new service: new sockets for it alone
	// Backends: the backends, backends_file or kubernetes key changed
	// (weights and states are in the list); the source is replaced.
	Backends bool
	Limits   bool // cidroute.Pipeline.SetLimits applies them
	Health   bool // health_check changed, appeared or went away
}

// A Delta is what moving a running program from one configuration to the
// next changes, as Config.Diff finds it.
type Delta struct {
	LogLevel bool           // log_level changed (Effective.LogLevel is the new one)
	Services []ServiceDelta // the services added or changed in place, in the file's order
	// Refused are the changes that need new sockets or a new pipeline. A
	// service with a refused key keeps its whole running configuration,
	// so that a half-applied change (new backends of another protocol)
	// never routes; the other services and log_level still apply.
	Refused []Refusal
	// Effective is the configuration that runs once the delta is applied:
	// next, except for the refused keys and services, which keep their
	// running values (a service missing from next keeps running).
	Effective *Config
}

// Diff compares the running configuration c with next (a reloaded file)
// and says what can change in place. Neither is modified.
func (c *Config) Diff(next *Config) Delta {
	eff := *next
	eff.Services = nil
	d := Delta{Effective: &eff}
	refuse := func(service, key string) { d.Refused = append(d.Refused, Refusal{service, key}) }
	if c.Seed != next.Seed {
		refuse("", "hrw_seed")
		eff.Seed = c.Seed
	}
	if c.MetricsListen != next.MetricsListen {
		refuse("", "metrics_listen")
		eff.MetricsListen = c.MetricsListen
	}
	if c.PprofListen != next.PprofListen {
		refuse("", "pprof_listen")
		eff.PprofListen = c.PprofListen
	}
	if c.MaxDatagram != next.MaxDatagram {
		refuse("", "max_datagram") // the workers' buffers are sized at start
		eff.MaxDatagram = c.MaxDatagram
	}
	if !slices.Equal(c.XDPInterfaces, next.XDPInterfaces) {
		refuse("", "xdp_interfaces")
		eff.XDPInterfaces = c.XDPInterfaces
	}
	d.LogLevel = c.LogLevel != next.LogLevel
	for _, ns := range next.Services {
		cur, ok := c.service(ns.Name)
		if !ok {
			d.Services = append(d.Services, ServiceDelta{Name: ns.Name, Added: true})
			eff.Services = append(eff.Services, ns)
			continue
		}
		if keys := socketKeys(cur, ns); len(keys) > 0 {
			for _, k := range keys {
				refuse(ns.Name, k)
			}
			eff.Services = append(eff.Services, cur)
			continue
		}
		sd := ServiceDelta{Name: ns.Name,
			Backends: !sameSource(cur, ns),
			Limits:   cur.Limits != ns.Limits,
			Health:   !reflect.DeepEqual(cur.Health, ns.Health)}
		if sd.Backends || sd.Limits || sd.Health {
			d.Services = append(d.Services, sd)
		}
		eff.Services = append(eff.Services, ns)
	}
	for _, cur := range c.Services {
		if _, ok := next.service(cur.Name); !ok {
			refuse(cur.Name, "")
			eff.Services = append(eff.Services, cur)
		}
	}
	return d
}

func (c *Config) service(name string) (Service, bool) {
	for _, s := range c.Services {
		if s.Name == name {
			return s, true
		}
	}
	return Service{}, false
}

// socketKeys lists the keys of a service whose change needs new sockets
// or a new router (routing rules are immutable while datagrams use them).
func socketKeys(a, b Service) []string {
	var keys []string
	add := func(changed bool, key string) {
		if changed {
			keys = append(keys, key)
		}
	}
	add(a.Listen != b.Listen, "listen")
	add(a.Public != b.Public, "public")
	add(a.Protocol != b.Protocol, "protocol")
	add(a.CIDLen != b.CIDLen, "cid_length")
	ae, be := a.CIDEncryption, b.CIDEncryption
	add((ae == nil) != (be == nil), "cid_codec")
	if ae != nil && be != nil {
		add(ae.NonceLen != be.NonceLen, "cid_nonce_length")
		add(ae.KeysFile != be.KeysFile, "cid_keys_file")
	}
	add(a.Transparent != b.Transparent, "proxy_protocol")
	add(a.OriginalSource != b.OriginalSource, "original_source")
	add(a.MaxSessions != b.MaxSessions, "max_sessions")
	add(a.SessionMemory != b.SessionMemory, "session_memory")
	add(a.SessionIdle != b.SessionIdle, "session_idle")
	add(a.Workers != b.Workers, "workers")
	add(a.RecvBuffer != b.RecvBuffer, "recv_buffer")
	add(a.SendBuffer != b.SendBuffer, "send_buffer")
	add(a.EarlyDrop != b.EarlyDrop, "early_drop")
	add(a.MaxAge != b.MaxAge, "max_registry_age")
	add(a.SlowStart != b.SlowStart, "slow_start")
	add(a.RequireDTLS13CID != b.RequireDTLS13CID, "require_dtls13_cid")
	add(a.Unroutable != b.Unroutable, "unroutable")
	return keys
}

// sameSource reports whether two services read their backends from the
// same place with the same list.
func sameSource(a, b Service) bool {
	return slices.Equal(a.Backends, b.Backends) && a.BackendsFile == b.BackendsFile &&
		reflect.DeepEqual(a.Kubernetes, b.Kubernetes)
}

// Apply applies the Backends and Health changes of d's existing services,
// taking their new definitions from d.Effective: a changed backend list or
// source is replaced by a new source on the same registry (a static list
// is published before Apply returns; with another source the registry
// routes on the previous backends until it publishes), and a changed health_check by a new checker,
// which inherits the old one's down marks (no health_check: stopping the
// old checker lifts every mark it set, whatever the backend's state). The services' sockets and routing are not touched. Added
// services are AddService's; limits are the Pipeline's (SetLimits). A
// service that cannot be changed (its new source fails to build) keeps
// what it had, and the error names it.
func (r *Registries) Apply(d Delta, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	var errs []error
	for _, sd := range d.Services {
		if sd.Added || !(sd.Backends || sd.Health) {
			continue
		}
		sc, ok := d.Effective.service(sd.Name)
		if !ok {
			continue
		}
		if err := r.apply(sc, sd, o, log.With("service", sc.Name)); err != nil {
			errs = append(errs, fmt.Errorf("service %q: %w", sc.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Registries) apply(sc Service, sd ServiceDelta, o Options, log *slog.Logger) error {
	r.mu.Lock()
	i := slices.IndexFunc(r.services, func(s *service) bool { return s.name == sc.Name })
	var s *service
	if i >= 0 {
		s = r.services[i]
	}
	r.mu.Unlock()
	if s == nil {
		return fmt.Errorf("no such service")
	}
	if sd.Backends {
		src, file, static, err := newSource(sc, o, log)
		if err != nil {
			return err
		}
		if static {
			// Published before Apply returns, so that the reload is done
			// when it says so; the source then only confirms.
			if err := s.updater.Update(sc.Backends); err != nil {
				return err
			}
			src = publishedStatic(sc.Backends)
		}
		r.mu.Lock()
		stop, done := s.srcStop, s.srcDone
		r.mu.Unlock()
		r.stopWait(stop, done, "the replaced backend source", log)
		r.mu.Lock()
		s.source, s.file, s.srcStop, s.srcDone = src, file, nil, nil
		r.startSourceLocked(s)
		r.mu.Unlock()
		log.Info("backend source replaced", "source", sourceName(sc))
	}
	if sd.Health {
		c, err := newChecker(s.reg, sc, o)
		if err != nil {
			return err
		}
		r.mu.Lock()
		old, stop, done := s.checker, s.hcStop, s.hcDone
		r.mu.Unlock()
		if c != nil && old != nil {
			c.Inherit(old.Down())
		}
		r.stopWait(stop, done, "the replaced health checker", log)
		r.mu.Lock()
		s.checker, s.hcStop, s.hcDone = c, nil, nil
		r.startCheckerLocked(s)
		r.mu.Unlock()
		log.Info("health checks replaced", "health_check", c != nil)
	}
	return nil
}

// publishedStatic is a static list that Apply has published already: it
// confirms it as registry.Static does, without publishing it again.
type publishedStatic []registry.Backend

func (s publishedStatic) Run(ctx context.Context, u registry.Updater) error {
	return registry.Static(s).Run(ctx, &skipFirstUpdate{Updater: u})
}

// skipFirstUpdate drops the first Update; MaxAge is forwarded, for
// registry.Static's pace.
type skipFirstUpdate struct {
	registry.Updater
	skipped bool
}

func (u *skipFirstUpdate) Update(bs []registry.Backend) error {
	if !u.skipped {
		u.skipped = true
		return nil
	}
	return u.Updater.Update(bs)
}

func (u *skipFirstUpdate) MaxAge() time.Duration {
	if m, ok := u.Updater.(interface{ MaxAge() time.Duration }); ok {
		return m.MaxAge()
	}
	return 0
}

func sourceName(sc Service) string {
	switch {
	case sc.Kubernetes != nil:
		return "kubernetes " + sc.Kubernetes.namespace() + "/" + sc.Kubernetes.Service
	case sc.BackendsFile != "":
		return "backends_file " + sc.BackendsFile
	case sc.Backends != nil:
		return fmt.Sprintf("backends (%d)", len(sc.Backends))
	}
	return "the program's"
}

// AddService builds one more service's registry, source, key file and
// checker, as Build does, starts them if Run runs, and returns its
// definition for cidroute.Pipeline.AddService. If the pipeline refuses
// it, RemoveService takes it back.
func (r *Registries) AddService(sc Service, o Options) (cidroute.Service, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.ContainsFunc(r.services, func(s *service) bool { return s.name == sc.Name }) {
		return cidroute.Service{}, fmt.Errorf("service %q: already running", sc.Name)
	}
	s, def, err := r.build(nil, sc, o, log.With("service", sc.Name))
	if err != nil {
		return cidroute.Service{}, fmt.Errorf("service %q: %w", sc.Name, err)
	}
	r.services = append(r.services, s)
	r.defs = append(r.defs, def)
	r.startLocked(s)
	return def, nil
}

// RemoveService stops and forgets a service that AddService added and the
// pipeline refused.
func (r *Registries) RemoveService(name string) {
	r.mu.Lock()
	i := slices.IndexFunc(r.services, func(s *service) bool { return s.name == name })
	if i < 0 {
		r.mu.Unlock()
		return
	}
	s := r.services[i]
	r.services = slices.Delete(r.services, i, i+1)
	r.defs = slices.Delete(r.defs, i, i+1)
	r.mu.Unlock()
	for _, stop := range []context.CancelFunc{s.srcStop, s.hcStop, s.keysStop} {
		if stop != nil {
			stop()
		}
	}
	s.reg.Close()
}
