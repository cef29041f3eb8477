package proxyapp

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/cidroute/cidroute/proxyconfig"
)

// The results of a SIGHUP reload, the cidroute_config_reloads_total
// labels.
const (
	reloadApplied = iota // everything in the file runs now
	reloadPartial        // some keys were refused (they need a handover) or failed; the rest applied
	reloadInvalid        // the file could not be read or is invalid: nothing changed
	numReloadResults
)

var reloadResults = [numReloadResults]string{"applied", "partial", "invalid"}

// reload is SIGHUP: it re-reads the configuration file and applies what
// can change without new sockets for running services (proxyconfig.Diff):
// backends, weights and states (inline or a new source), limits, log
// level, health checks, and new services, which get sockets of their
// own. A key that needs new sockets is logged by name and left as it runs
// (a restart handover applies it); a bad file changes nothing. Either way
// the result is counted. Every backends_file and cid_keys_file is read
// again too. Without a configuration file (tests that serve a parsed
// Config) only the files are.
func (p *proxy) reload(ctx context.Context) {
	path := p.opts.configPath
	if path == "" {
		p.log.Info("SIGHUP: re-reading backend and CID key files")
		p.regs.Reload()
		return
	}
	p.log.Info("SIGHUP: reloading the configuration", "config", path)
	next, err := loadConfig(ctx, path, p.opts)
	if err != nil {
		p.reloads[reloadInvalid].Add(1)
		p.log.Error("reload refused: the configuration is invalid; nothing changed", "config", path, "err", err)
		return
	}
	p.log.Debug("reload: the file", "config", next.Summary())
	d := p.cur.Diff(next)
	result := reloadApplied
	for _, r := range d.Refused {
		result = reloadPartial
		why := "it needs new sockets: apply it with a restart handover (cidproxy -handover); the service keeps its running configuration"
		switch {
		case r.Service == "":
			why = "it needs new sockets or a new pipeline: apply it with a restart handover (cidproxy -handover)"
		case r.Key == "":
			why = "a running service is not removed by a reload: a restart handover removes it"
		}
		p.log.Warn("reload: key not applied", "key", r.String(), "why", why)
	}
	var applied []string
	if d.LogLevel {
		p.opts.level.Set(d.Effective.LogLevel)
		applied = append(applied, "log_level")
	}
	o := p.configOptions()
	if err := p.regs.Apply(d, o); err != nil {
		result = reloadPartial
		p.log.Error("reload: a service's backends or health checks could not be replaced; it keeps them", "err", err)
	}
	for _, sd := range d.Services {
		sc := mustService(d.Effective, sd.Name)
		switch {
		case sd.Added:
			if err := p.addService(sc, o); err != nil {
				result = reloadPartial
				p.log.Error("reload: service not added", "service", sd.Name, "err", err)
				d.Effective.Services = without(d.Effective.Services, sd.Name)
				continue
			}
			applied = append(applied, fmt.Sprintf("services[%q] (added)", sd.Name))
			continue
		case sd.Limits:
			if err := p.pipe.SetLimits(sd.Name, sc.Limits); err != nil {
				result = reloadPartial
				p.log.Error("reload: limits not applied", "service", sd.Name, "err", err)
			} else {
				applied = append(applied, fmt.Sprintf("services[%q].limits", sd.Name))
			}
		}
		if sd.Backends {
			applied = append(applied, fmt.Sprintf("services[%q].backends", sd.Name))
		}
		if sd.Health {
			applied = append(applied, fmt.Sprintf("services[%q].health_check", sd.Name))
		}
	}
	p.cur = d.Effective
	p.regs.Reload()
	p.reloads[result].Add(1)
	p.log.Info("reload done", "result", reloadResults[result], "applied", strings.Join(applied, " "), "refused", len(d.Refused))
}

// addService gives a new service its registry, source and sockets.
func (p *proxy) addService(sc proxyconfig.Service, o proxyconfig.Options) error {
	def, err := p.regs.AddService(sc, o)
	if err != nil {
		return err
	}
	if err := p.pipe.AddService(def); err != nil {
		p.regs.RemoveService(sc.Name)
		return err
	}
	p.namesMu.Lock()
	p.names = append(p.names, sc.Name)
	p.namesMu.Unlock()
	if p.accel != nil {
		p.log.Warn("reload: the XDP fast path does not serve a service added by a reload; its sockets do", "service", sc.Name)
	}
	return nil
}

// loadConfig reads and validates the configuration file as a start does:
// -check, a start and a reload read it here, so that they refuse the same
// mistakes with the same message.
func loadConfig(ctx context.Context, path string, opts Options) (*proxyconfig.Config, error) {
	cfg, err := proxyconfig.Load(ctx, path)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(proxyconfig.Options{Kubernetes: opts.Kubernetes}); err != nil {
		var ce *proxyconfig.Error
		if errors.Is(err, proxyconfig.ErrNoKubernetes) && errors.As(err, &ce) {
			ce.Problem = "this build of cidproxy has no Kubernetes source"
			ce.Fix = `run the Kubernetes build (examples/kubernetes/cidproxy), or list the backends with "backends" or "backends_file"`
		}
		return nil, err
	}
	return cfg, nil
}

func mustService(c *proxyconfig.Config, name string) proxyconfig.Service {
	for _, s := range c.Services {
		if s.Name == name {
			return s
		}
	}
	panic(errors.New("proxyapp: delta names a service the configuration lacks: " + name))
}

func without(ss []proxyconfig.Service, name string) []proxyconfig.Service {
	var out []proxyconfig.Service
	for _, s := range ss {
		if s.Name != name {
			out = append(out, s)
		}
	}
	return out
}
