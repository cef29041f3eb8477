package proxyconfig

import (
	"encoding/json"
	"fmt"
	"math"
	"net/netip"

	"github.com/cidroute/cidroute/registry"
)

// fileBackend is one entry of a backend list, inline ("backends") or in a
// backends_file: the format of registry.DecodeBackends, decoded here so
// that each mistake is reported at its key.
type fileBackend struct {
	Ordinal *int64  `json:"ordinal"`
	Address *string `json:"address"`
	Weight  *int64  `json:"weight"`
	State   *string `json:"state"`
	// ReadySince is when the backend became ready (RFC 3339), for
	// slow_start.
	ReadySince *string `json:"ready_since"`
}

// parseBackends decodes and validates the backend list at path. The
// rules are registry.Validate's, which checks the result again; the
// errors wrap its sentinels (registry.ErrDuplicateOrdinal ...).
func parseBackends(src *source, path string) ([]registry.Backend, error) {
	var list []json.RawMessage
	if err := src.decode(path, &list); err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, src.wrap(path, registry.ErrEmptyList, "the list is empty",
			`list the backends (to stop a service, keep them with "state": "gone")`)
	}
	bs := make([]registry.Backend, len(list))
	ordinals := map[uint8]int{}
	addrs := map[netip.AddrPort]int{}
	for i := range list {
		p := fmt.Sprintf("%s[%d]", path, i)
		at := func(key string) string { return p + "." + key }
		var fb fileBackend
		if err := src.decode(p, &fb); err != nil {
			return nil, err
		}
		b := registry.Backend{Weight: 1}
		switch o := fb.Ordinal; {
		case o == nil:
			return nil, src.err(at("ordinal"), "missing", "add it: "+want(at("ordinal")))
		case *o == registry.MaxOrdinal+1:
			return nil, src.wrap(at("ordinal"), registry.ErrReservedOrdinal, "255 is reserved (CIDs that name no backend)", "write "+want(at("ordinal")))
		case *o < 0 || *o > registry.MaxOrdinal:
			return nil, src.wrap(at("ordinal"), registry.ErrInvalidOrdinal, fmt.Sprintf("%d is out of range", *o), "write "+want(at("ordinal")))
		default:
			b.Ordinal = uint8(*o)
		}
		if fb.Address == nil {
			return nil, src.err(at("address"), "missing", "add it: "+want(at("address")))
		}
		a, err := netip.ParseAddrPort(*fb.Address)
		if err != nil {
			return nil, src.wrap(at("address"), registry.ErrInvalidAddr, fmt.Sprintf("%q is not ip:port (an IP address, not a host name, and a port)", *fb.Address), "write "+want(at("address")))
		}
		b.Addr = a
		switch ip := a.Addr().Unmap(); {
		case ip.IsUnspecified():
			return nil, src.wrap(at("address"), registry.ErrUnspecifiedAddr, fmt.Sprintf("%q is an unspecified address", *fb.Address), "write the backend's own address")
		case ip.IsMulticast() || ip == broadcast:
			return nil, src.wrap(at("address"), registry.ErrInvalidAddr, fmt.Sprintf("%q is a multicast or broadcast address", *fb.Address), "write the backend's own (unicast) address")
		case a.Port() == 0:
			return nil, src.wrap(at("address"), registry.ErrZeroPort, fmt.Sprintf("%q has port 0", *fb.Address), "write the port the backend listens on")
		}
		if w := fb.Weight; w != nil {
			switch {
			case *w == 0:
				return nil, src.wrap(at("weight"), registry.ErrZeroWeight, "0 is not a weight",
					`write 1 or more, or leave the key out for 1; for no new sessions write "state": "draining"`)
			case *w < 0 || *w > math.MaxUint32:
				return nil, src.wrap(at("weight"), registry.ErrDecode, fmt.Sprintf("%d is out of range", *w), fmt.Sprintf("write 1-%d (default 1)", uint32(math.MaxUint32)))
			}
			b.Weight = uint32(*w)
		}
		if fb.State != nil {
			if b.State, err = registry.ParseState(*fb.State); err != nil {
				return nil, src.wrap(at("state"), err, fmt.Sprintf("%q is not a state", *fb.State), "write "+want(at("state")))
			}
		}
		if fb.ReadySince != nil {
			if b.ReadySince, err = registry.ParseReadySince(*fb.ReadySince); err != nil {
				return nil, src.wrap(at("ready_since"), err, fmt.Sprintf("%q is not an RFC 3339 time", *fb.ReadySince), "write "+want(at("ready_since")))
			}
		}
		if j, dup := ordinals[b.Ordinal]; dup {
			return nil, src.wrap(at("ordinal"), registry.ErrDuplicateOrdinal, fmt.Sprintf("%d is already the ordinal of %s[%d]", b.Ordinal, path, j),
				"give each backend an ordinal of its own (the one its CIDs carry)")
		}
		ordinals[b.Ordinal] = i
		ua := netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
		if j, dup := addrs[ua]; dup {
			return nil, src.wrap(at("address"), registry.ErrDuplicateAddr, fmt.Sprintf("%v is already the address of %s[%d]", ua, path, j),
				"give each backend an address of its own")
		}
		addrs[ua] = i
		bs[i] = b
	}
	if err := registry.Validate(bs); err != nil { // the rules above are these; kept in step by the tests
		return nil, src.wrap(path, err, err.Error(), "")
	}
	return bs, nil
}
