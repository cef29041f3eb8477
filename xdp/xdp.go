//go:build linux

package xdp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/hrw"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/registry"
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Limits of the program's maps (bpf/cidroute.c).
const (
	MaxServices = 64 // services one Program serves
	numSlots    = 32 // counter slots per service and direction
	slotPassed  = 31
	addrSlots   = 1024
	addrProbes  = 16
)

// DefaultPoll is how often Run looks for a new snapshot, a change of the
// stale flag and of the host's addresses.
const DefaultPoll = 20 * time.Millisecond

// Options configure a Program.
type Options struct {
	// Poll is the interval of Run's checks (0 = DefaultPoll). A snapshot
	// reaches the program at most this long after the registry publishes
	// it.
	Poll time.Duration
	// Logger receives attach, detach and error logs; nil means
	// slog.Default().
	Logger *slog.Logger
}

// A Program is the loaded XDP program and its maps. Add services, attach it
// to interfaces, and Run it to keep its snapshots current; Close detaches
// it. Its methods are safe for concurrent use.
type Program struct {
	log  *slog.Logger
	poll time.Duration
	objs cidrouteObjects
	// inner is the spec of one snapshot map, created anew for each
	// snapshot.
	inner *ebpf.MapSpec

	// restore holds the loopback forwarding settings Load changed.
	restore map[string]string

	mu       sync.Mutex
	services []*service
	links    []attached
	locals   map[[16]byte]bool
	nets     map[cidrouteNetKey]bool // local routes (cidroute.LocalNets)
	// ownGen counts changes of what the backends' own-address answers
	// depend on: the host's addresses and the services.
	ownGen uint64
	closed bool
}

type attached struct {
	ifname string
	mode   Mode
	l      link.Link
}

type service struct {
	cfg    Service
	id     uint32
	snap   *registry.Snapshot // the one in the program
	ownGen uint64             // the Program's ownGen it was written at
	stale  bool
	inner  *ebpf.Map
}

// Load loads the program into the kernel; it needs CAP_BPF and
// CAP_NET_ADMIN (root).
func Load(opts Options) (*Program, error) {
	spec, err := loadCidroute()
	if err != nil {
		return nil, fmt.Errorf("xdp: %w", err)
	}
	p := &Program{log: opts.Logger, poll: opts.Poll, locals: map[[16]byte]bool{}, nets: map[cidrouteNetKey]bool{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.poll <= 0 {
		p.poll = DefaultPoll
	}
	snaps := spec.Maps["snaps"]
	if snaps == nil || snaps.InnerMap == nil {
		return nil, errors.New("xdp: the object has no snapshot map")
	}
	p.inner = snaps.InnerMap.Copy()
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("xdp: loading the program: %+v", ve)
		}
		return nil, fmt.Errorf("xdp: loading the program: %w", err)
	}
	if err := p.lookupForwarding(); err != nil {
		p.objs.Close()
		return nil, err
	}
	if err := p.refreshLocals(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// The program finds next hops with bpf_fib_lookup, which the kernel
// answers only for an input interface with forwarding on; it looks up as
// from loopback, and lookupForwarding turns forwarding on there (lo only:
// no real interface starts routing). Close restores it.
var loForwarding = []string{"/proc/sys/net/ipv4/conf/lo/forwarding", "/proc/sys/net/ipv6/conf/lo/forwarding"}

func (p *Program) lookupForwarding() error {
	p.restore = map[string]string{}
	for _, f := range loForwarding {
		b, err := os.ReadFile(f)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // no IPv6 on this host
			}
			return fmt.Errorf("xdp: %w", err)
		}
		if v := strings.TrimSpace(string(b)); v != "1" {
			if err := os.WriteFile(f, []byte("1"), 0); err != nil {
				return fmt.Errorf("xdp: the FIB lookup needs forwarding on lo: %w", err)
			}
			p.restore[f] = v
			p.log.Info("xdp: forwarding turned on for lo, for the FIB lookup", "file", f)
		}
	}
	return nil
}

// Service is one service of a cidroute Pipeline as the program sees it.
// ServiceOf fills one from the pipeline's configuration.
type Service struct {
	Name     string            // cidroute.Service.Name, for its counters
	Protocol cidroute.Protocol // picks the in-kernel classifier
	// Codec is the service's CID codec: dtls.OrdinalFirst and quic.LB are
	// decoded in the kernel; with any other codec every datagram of the
	// service goes up to the pipeline.
	Codec cidroute.CIDCodec
	// Public is the Router's service address (RouterConfig.Service, or
	// Listen when that is zero); Listen the address the service's
	// sockets are bound to, with the bound port.
	Public, Listen netip.AddrPort
	// Upstreams are the pipeline's upstream sockets for the service
	// (Pipeline.UpstreamAddrs): forwarded datagrams leave from the first
	// one's port, and replies to any of them are the reverse path's.
	Upstreams []netip.AddrPort
	Backends  cidroute.Backends // the Router's backends; each snapshot is copied into the maps
	// MaxDatagram is the pipeline's limit (0 = 9216): larger datagrams go
	// up, where they are counted as malformed.
	MaxDatagram int
	// Unroutable is the Router's policy for a QUIC-LB CID no
	// configuration decodes (RouterConfig.Unroutable).
	Unroutable cidroute.UnroutablePolicy
	// Pass hands every datagram up: for admission limits (not
	// implemented in the kernel), a custom classifier or encoder, or
	// transparent mode.
	Pass bool
}

// ServiceOf describes the pipeline's service sc for the program: the
// pipeline must have been created from a configuration holding sc.
func ServiceOf(p *cidroute.Pipeline, sc cidroute.Service, maxDatagram int) (Service, error) {
	listen, ok := p.Addr(sc.Name)
	r, rok := p.Router(sc.Name)
	ups, uok := p.UpstreamAddrs(sc.Name)
	if !ok || !rok || !uok {
		return Service{}, fmt.Errorf("xdp: the pipeline has no service %q", sc.Name)
	}
	pub := sc.RouterConfig.PublicAddr
	if !pub.IsValid() {
		pub = listen
	}
	if pub.Port() == 0 {
		pub = netip.AddrPortFrom(pub.Addr(), listen.Port())
	}
	s := Service{
		Name: sc.Name, Protocol: sc.Protocol, Codec: r.Codec(),
		Public: pub, Listen: listen, Upstreams: ups,
		Backends: sc.Backends, MaxDatagram: maxDatagram,
		Unroutable: sc.RouterConfig.Unroutable,
	}
	enc, plain := sc.Encoder.(cidroute.PPv2Encoder)
	s.Pass = sc.Transparent || sc.Limits != (cidroute.Limits{}) || sc.Classifier != nil ||
		(sc.Encoder != nil && (!plain || enc.CRC))
	return s, nil
}

// AddService gives the program a service. Its snapshot is written at once.
func (p *Program) AddService(s Service) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("xdp: program closed")
	}
	if len(p.services) == MaxServices {
		return fmt.Errorf("xdp: more than %d services", MaxServices)
	}
	if s.Backends == nil || !s.Listen.IsValid() || !s.Public.IsValid() || s.Listen.Port() == 0 {
		return fmt.Errorf("xdp: service %q: backends, listen and public address needed", s.Name)
	}
	if s.MaxDatagram == 0 {
		s.MaxDatagram = 9216
	}
	// Unmapped before any check: [::ffff:0.0.0.0] is a wildcard too.
	s.Listen, s.Public = unmap(s.Listen), unmap(s.Public)
	id := uint32(len(p.services))
	cfg := cidrouteSvcCfg{Id: id, MaxDgram: uint16(min(s.MaxDatagram, 0xffff))}
	switch s.Protocol {
	case cidroute.DTLS:
		cfg.Proto = 1
	case cidroute.QUIC:
		cfg.Proto = 2
	default:
		return fmt.Errorf("xdp: service %q: protocol %v", s.Name, s.Protocol)
	}
	switch c := s.Codec.(type) {
	case dtls.OrdinalFirst:
		cfg.Codec, cfg.CidLen = 1, uint8(c.Len())
	case quic.LB:
		cfg.Codec, cfg.CidLen, cfg.LbConfig = 2, uint8(c.Len()), c.ConfigID
		if c.SelfEncodeLength {
			cfg.LbSelf = 1
		}
		if s.Unroutable == cidroute.UnroutableHash {
			cfg.LbHash = 1
		}
		if c.Validate() != nil {
			s.Pass = true
		}
	default:
		s.Pass = true // an encrypted or custom codec: the pipeline decodes it
		if s.Codec != nil {
			cfg.CidLen = uint8(min(s.Codec.Len(), 255))
		}
	}
	if s.Protocol == cidroute.QUIC && cfg.CidLen > quic.MaxCIDLen {
		s.Pass = true
	}
	if s.Pass {
		cfg.Pass = 1
	}
	pub := s.Public
	// The datagram's own destination is the PPv2 destination only when
	// the pipeline measures it (packet info on a wildcard socket).
	if pub.Addr().IsUnspecified() && s.Listen.Addr().IsUnspecified() {
		cfg.Measured = 1
	}
	if len(s.Upstreams) > 0 {
		cfg.UpPort = s.Upstreams[0].Port()
	} else {
		cfg.Pass = 1
	}
	cfg.Pub.Ip, cfg.Pub.Port = pub.Addr().As16(), pub.Port()
	cfg.Listen.Ip, cfg.Listen.Port = s.Listen.Addr().As16(), s.Listen.Port()

	if err := p.objs.ServiceById.Put(id, &cfg); err != nil {
		return fmt.Errorf("xdp: service %q: %w", s.Name, err)
	}
	for _, k := range serviceKeys(s.Listen) {
		if err := p.objs.Services.Put(&k, &cfg); err != nil {
			return fmt.Errorf("xdp: service %q: %w", s.Name, err)
		}
	}
	for _, u := range s.Upstreams {
		if err := p.objs.Upstreams.Put(u.Port(), id); err != nil {
			return fmt.Errorf("xdp: service %q: upstream %v: %w", s.Name, u, err)
		}
	}
	svc := &service{cfg: s, id: id}
	p.services = append(p.services, svc)
	// Its addresses can be another service's backends'.
	p.ownGen++
	var errs []error
	for _, s := range p.services {
		errs = append(errs, p.syncService(s))
	}
	return errors.Join(errs...)
}

// serviceKeys are the services-map keys of a listen address: the address
// itself; a wildcard IPv6 socket takes IPv4 too.
func serviceKeys(l netip.AddrPort) []cidrouteSvcKey {
	key := func(a netip.Addr) cidrouteSvcKey {
		var k cidrouteSvcKey
		k.A.Ip, k.A.Port = a.As16(), l.Port()
		return k
	}
	a := l.Addr().Unmap()
	if a == netip.IPv6Unspecified() {
		return []cidrouteSvcKey{key(a), key(netip.IPv4Unspecified())}
	}
	return []cidrouteSvcKey{key(a)}
}

func unmap(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// Sync brings every service's snapshot, stale flag and the host's
// addresses up to date once. Run calls it every Poll.
func (p *Program) Sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("xdp: program closed")
	}
	// The host's addresses first: the snapshots' own-address answers
	// follow them.
	errs := []error{p.refreshLocals()}
	for _, s := range p.services {
		errs = append(errs, p.syncService(s))
	}
	return errors.Join(errs...)
}

func (p *Program) syncService(s *service) error {
	snap, stale := s.cfg.Backends.Snapshot(), s.cfg.Backends.Stale()
	if snap != s.snap || s.ownGen != p.ownGen {
		m, err := ebpf.NewMap(p.inner)
		if err != nil {
			return fmt.Errorf("xdp: service %q: snapshot map: %w", s.cfg.Name, err)
		}
		own := func(ip [16]byte, port uint16) byte { return p.ownBackend(s, ip, port) }
		if err := m.Put(uint32(0), encodeSnapshot(snap, own)); err != nil {
			m.Close()
			return fmt.Errorf("xdp: service %q: snapshot: %w", s.cfg.Name, err)
		}
		// One map update swaps the whole snapshot; datagrams in flight
		// finish on the old map, which the kernel frees after them.
		if err := p.objs.Snaps.Put(s.id, m); err != nil {
			m.Close()
			return fmt.Errorf("xdp: service %q: publishing the snapshot: %w", s.cfg.Name, err)
		}
		if s.inner != nil {
			s.inner.Close()
		}
		s.inner, s.snap, s.ownGen = m, snap, p.ownGen
	}
	if stale != s.stale || snap == nil {
		v := uint32(0)
		if stale {
			v = 1
		}
		if err := p.objs.Stale.Put(s.id, v); err != nil {
			return fmt.Errorf("xdp: service %q: stale flag: %w", s.cfg.Name, err)
		}
		s.stale = stale
	}
	return nil
}

// The layout of struct snap in bpf/cidroute.c.
const (
	snapOwner    = 16
	snapBackends = snapOwner + hrw.Buckets
	backendSize  = 22
	snapSlots    = snapBackends + 256*backendSize
	snapSize     = snapSlots + addrSlots
)

// encodeSnapshot lays out snap as the program's struct snap: the HRW seed
// and bucket table, the backends by ordinal with own's answer for each,
// and the serving backends by address.
func encodeSnapshot(snap *registry.Snapshot, own func(ip [16]byte, port uint16) byte) []byte {
	b := make([]byte, snapSize)
	ne := binary.NativeEndian
	if snap == nil {
		return b
	}
	if t := snap.Table(); t != nil && t.Len() > 0 {
		ne.PutUint64(b[0:], t.Seed())
		ne.PutUint32(b[8:], uint32(t.Len()))
		t.Owners((*[hrw.Buckets]uint8)(b[snapOwner:snapBackends]))
	}
	slots := b[snapSlots:snapSize]
	for i := range slots {
		slots[i] = 0xff
	}
	overflow := false
	for _, be := range snap.Backends() {
		e := b[snapBackends+int(be.Ordinal)*backendSize:]
		ip := be.Addr.Addr().As16()
		copy(e[0:16], ip[:])
		ne.PutUint16(e[16:], be.Addr.Port())
		e[18] = byte(be.State)
		e[19] = 1
		e[20] = own(ip, be.Addr.Port())
		if !be.State.Serving() {
			continue
		}
		h := addrHome(ip, be.Addr.Port())
		placed := false
		for i := range addrProbes {
			j := (h + uint32(i)) & (addrSlots - 1)
			if slots[j] == 0xff {
				slots[j], placed = be.Ordinal, true
				break
			}
		}
		overflow = overflow || !placed
	}
	if overflow {
		ne.PutUint32(b[12:], 1) // replies go up to the pipeline
	}
	return b
}

// Answers of the forward rule's own-address test for a backend (struct
// backend's own).
const (
	ownNo   = 0
	ownYes  = 1 // dropped as OwnAddress
	ownPass = 2 // handed up: the pipeline's own-address set decides
)

// ownBackend is the forward rule's own-address test (Router.Forward's
// OwnAddress) for a backend of s at ip:port (16-byte form) as far as the
// program can know it: ownYes at the service's public address, a service's
// listen address, or a wildcard service's port on this host; ownPass at
// another of this host's addresses (an upstream port or a socket the
// program does not know: only the pipeline has the whole set); else ownNo.
// p.mu is held.
func (p *Program) ownBackend(s *service, ip [16]byte, port uint16) byte {
	if port == s.cfg.Public.Port() && ip == s.cfg.Public.Addr().As16() {
		return ownYes
	}
	listening := func(ip [16]byte) bool {
		for _, o := range p.services {
			for _, k := range serviceKeys(o.cfg.Listen) {
				if k.A.Ip == ip && k.A.Port == port {
					return true
				}
			}
		}
		return false
	}
	if listening(ip) {
		return ownYes
	}
	a := netip.AddrFrom16(ip)
	v4 := a.Is4In6()
	host := a.IsUnspecified() || p.locals[ip] || p.inLocalNet(ip)
	if v4 {
		host = host || a.Unmap().IsUnspecified() || a.Unmap().IsLoopback()
	} else {
		host = host || a == netip.IPv6Loopback()
	}
	if !host {
		return ownNo
	}
	wild := netip.IPv6Unspecified().As16()
	if v4 {
		wild = netip.IPv4Unspecified().As16()
	}
	if listening(wild) {
		return ownYes
	}
	return ownPass
}

// addrHome is the program's addr_home: the first slot of an address.
func addrHome(ip [16]byte, port uint16) uint32 {
	hi, lo := binary.LittleEndian.Uint64(ip[0:8]), binary.LittleEndian.Uint64(ip[8:16])
	p := uint64(port)
	x := lo ^ (p<<48 | p) + hi*0xff51afd7ed558ccd
	return uint32(x*0x9e3779b97f4a7c15>>54) & (addrSlots - 1)
}

// refreshLocals writes the host's addresses, which the reverse path must
// not relay to and the forward path serves on wildcard services, and the
// prefixes of its local routes: the sets the pipeline's own addresses are
// built from (cidroute.LocalAddrs, with the subnets' broadcast addresses,
// and cidroute.LocalNets), so that both rules see one host. A frame from
// the wire with a source in either goes up to the stack, which drops it.
func (p *Program) refreshLocals() error {
	addrs, err := cidroute.LocalAddrs()
	if err != nil {
		return fmt.Errorf("xdp: host addresses: %w", err)
	}
	prefixes, err := cidroute.LocalNets()
	if err != nil {
		return fmt.Errorf("xdp: local routes: %w", err)
	}
	now := map[[16]byte]bool{}
	for _, ip := range addrs {
		now[ip.Unmap().As16()] = true
	}
	nets := map[cidrouteNetKey]bool{}
	for _, n := range prefixes {
		nets[netKey(n)] = true
	}
	changed, errs := syncMap(p.objs.Locals, p.locals, now, uint8(1))
	changed2, errs2 := syncMap(p.objs.LocalNets, p.nets, nets, uint8(1))
	if changed || changed2 {
		p.ownGen++
	}
	p.locals, p.nets = now, nets
	return errors.Join(errs, errs2)
}

// syncMap makes the keys of m those of now, where old is what m holds.
func syncMap[K comparable](m *ebpf.Map, old, now map[K]bool, v uint8) (bool, error) {
	var errs []error
	changed := false
	for k := range now {
		if !old[k] {
			errs = append(errs, m.Put(&k, v))
			changed = true
		}
	}
	for k := range old {
		if !now[k] {
			errs = append(errs, m.Delete(&k))
			changed = true
		}
	}
	return changed, errors.Join(errs...)
}

// netKey is the local_nets key of n: its length over the 16-byte form.
func netKey(n netip.Prefix) cidrouteNetKey {
	n = n.Masked()
	bits := n.Bits()
	if n.Addr().Is4() {
		bits += 96
	}
	return cidrouteNetKey{Prefixlen: uint32(bits), Ip: n.Addr().As16()}
}

// inLocalNet reports whether ip (16-byte form) is in a local route.
// p.mu is held.
func (p *Program) inLocalNet(ip [16]byte) bool {
	a := netip.AddrFrom16(ip)
	for k := range p.nets {
		if netip.PrefixFrom(netip.AddrFrom16(k.Ip), int(k.Prefixlen)).Contains(a) {
			return true
		}
	}
	return false
}

// Run keeps the program's snapshots current until ctx is done.
func (p *Program) Run(ctx context.Context) error {
	t := time.NewTicker(p.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := p.Sync(); err != nil {
				p.log.Error("xdp: sync", "err", err)
			}
		}
	}
}

// Mode is how the program is attached to an interface.
type Mode string

const (
	Native  Mode = "native"  // in the driver, before any allocation
	Generic Mode = "generic" // after the driver built an skb: slower, works everywhere
)

// Attach attaches the program to the interface: natively where the driver
// supports it, else in generic mode, and says which.
func (p *Program) Attach(ifname string) (Mode, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return "", fmt.Errorf("xdp: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", errors.New("xdp: program closed")
	}
	var mac cidrouteMac
	copy(mac.A[:], iface.HardwareAddr)
	if err := p.objs.Macs.Put(uint32(iface.Index), &mac); err != nil {
		return "", fmt.Errorf("xdp: %s: %w", ifname, err)
	}
	if err := p.setRPFilter(ifname); err != nil {
		return "", err
	}
	mode := Native
	l, err := link.AttachXDP(link.XDPOptions{Program: p.objs.Cidroute, Interface: iface.Index, Flags: link.XDPDriverMode})
	if err != nil {
		mode = Generic
		var gerr error
		l, gerr = link.AttachXDP(link.XDPOptions{Program: p.objs.Cidroute, Interface: iface.Index, Flags: link.XDPGenericMode})
		if gerr != nil {
			return "", fmt.Errorf("xdp: attaching to %s: native: %v; generic: %w", ifname, err, gerr)
		}
	}
	p.links = append(p.links, attached{ifname: ifname, mode: mode, l: l})
	p.log.Info("xdp attached", "interface", ifname, "mode", string(mode))
	return mode, nil
}

// setRPFilter copies the kernel's reverse path filter for IPv4 (the larger
// of "all" and the interface's, over the attached interfaces): the program
// must refuse what the stack would have refused.
func (p *Program) setRPFilter(ifname string) error {
	read := func(name string) int {
		b, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + name + "/rp_filter")
		if err != nil {
			return 0
		}
		v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		return v
	}
	var cur cidrouteConfig
	if err := p.objs.Settings.Lookup(uint32(0), &cur); err != nil {
		return fmt.Errorf("xdp: settings: %w", err)
	}
	v := uint32(max(read("all"), read(ifname)))
	if v == 1 || cur.RpFilter == 1 {
		cur.RpFilter = 1 // strict anywhere: strict for all
	} else if v == 2 {
		cur.RpFilter = 2
	}
	return p.objs.Settings.Put(uint32(0), &cur)
}

// Close detaches the program from every interface and frees it.
func (p *Program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, a := range p.links {
		if err := a.l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("xdp: detaching from %s: %w", a.ifname, err))
		} else {
			p.log.Info("xdp detached", "interface", a.ifname)
		}
	}
	for _, s := range p.services {
		if s.inner != nil {
			s.inner.Close()
		}
	}
	errs = append(errs, p.objs.Close())
	for f, v := range p.restore {
		errs = append(errs, os.WriteFile(f, []byte(v), 0))
	}
	return errors.Join(errs...)
}

// Counters are one service's datagrams that the program decided, per
// direction; Passed are those it handed up to the pipeline, which counts
// them itself.
type Counters struct {
	cidroute.Counters
	Passed uint64 // handed up to the pipeline
}

// ServiceStats are a service's counters on the XDP path.
type ServiceStats struct {
	Name             string   // Service.Name
	Forward, Reverse Counters // client → backend, backend → client
}

// Stats sums the per-CPU counters of every service.
func (p *Program) Stats() ([]ServiceStats, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ServiceStats, len(p.services))
	for i, s := range p.services {
		out[i].Name = s.cfg.Name
		for dir, c := range []*Counters{&out[i].Forward, &out[i].Reverse} {
			for slot := range uint32(numSlots) {
				var per []uint64
				k := (s.id*2+uint32(dir))*numSlots + slot
				if err := p.objs.Counters.Lookup(k, &per); err != nil {
					return nil, fmt.Errorf("xdp: counters: %w", err)
				}
				var n uint64
				for _, v := range per {
					n += v
				}
				switch {
				case slot == slotPassed:
					c.Passed = n
				case slot == 0:
					c.Forwarded = n
					c.Received += n
				case slot < cidroute.NumReasons:
					c.Dropped[slot] = n
					c.Received += n
				}
			}
		}
	}
	return out, nil
}
