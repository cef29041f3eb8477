//go:build !linux

package main

import "github.com/cidroute/cidroute/examples/internal/proxyapp"

// No XDP outside Linux: "xdp_interfaces" is refused.
var startXDP proxyapp.XDPFunc
