package main

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/quic"
)

// A shape is the kind of datagram loadgen sends. Contents are meaningless;
// headers are what a proxy classifies and routes by.
type shape uint8

const (
	dtlsCID   shape = iota // DTLS 1.2 tls12_cid record: routed by the CID's ordinal
	dtlsHello              // DTLS ClientHello record: a new session, hashed by client address
	quicShort              // QUIC short header with a QUIC-LB DCID: routed by its server ID
	random                 // random bytes whose first byte no DTLS record starts with: junk a DTLS service drops as malformed
	numShapes
)

var shapeNames = [numShapes]string{"dtls-cid", "dtls-hello", "quic-short", "random"}

func (s shape) String() string { return shapeNames[s] }

// parseMix parses "dtls-cid=8,dtls-hello=1" (a name alone weighs 1) into
// a repeating pattern in which each shape appears as often as its weight,
// interleaved (smooth weighted round robin) rather than in runs.
func parseMix(s string) ([]shape, error) {
	var w [numShapes]int
	total := 0
	for _, part := range strings.Split(s, ",") {
		name, val, hasVal := strings.Cut(strings.TrimSpace(part), "=")
		sh := numShapes
		for i, n := range shapeNames {
			if n == name {
				sh = shape(i)
			}
		}
		if sh == numShapes {
			return nil, fmt.Errorf("loadgen: mix: unknown shape %q (want %s)", name, strings.Join(shapeNames[:], ", "))
		}
		weight := 1
		if hasVal {
			v, err := strconv.Atoi(val)
			if err != nil || v < 0 || v > 1000 {
				return nil, fmt.Errorf("loadgen: mix: weight %q of %s: want 0..1000", val, name)
			}
			weight = v
		}
		total += weight - w[sh]
		w[sh] = weight
	}
	if total == 0 {
		return nil, fmt.Errorf("loadgen: mix %q: all weights are 0", s)
	}
	pattern := make([]shape, 0, total)
	var cur [numShapes]int
	for range total {
		best := -1
		for i := range cur {
			cur[i] += w[i]
			if w[i] > 0 && (best < 0 || cur[i] > cur[best]) {
				best = i
			}
		}
		cur[best] -= total
		pattern = append(pattern, shape(best))
	}
	return pattern, nil
}

// parseOrdinals parses "0,1,2" or "0-3".
func parseOrdinals(s string) ([]uint8, error) {
	var out []uint8
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b > 254 || a > b {
			return nil, fmt.Errorf("loadgen: ordinals %q: want numbers or ranges in 0..254", s)
		}
		for o := a; o <= b; o++ {
			out = append(out, uint8(o))
		}
	}
	return out, nil
}

// shapeConfig is what building a datagram of any shape needs.
type shapeConfig struct {
	size       int // whole datagram, stamp included
	dtlsCIDLen int
	quicCIDLen int
}

// headerLen is the bytes in front of the payload (and the stamp at its end).
func (c shapeConfig) headerLen(s shape) int {
	switch s {
	case dtlsCID:
		return 13 + c.dtlsCIDLen
	case dtlsHello:
		return 13 + 12
	case random:
		return 0
	default:
		return 1 + c.quicCIDLen
	}
}

func (c shapeConfig) validate(pattern []shape) error {
	if c.size > maxDatagram {
		return fmt.Errorf("loadgen: size %d: at most %d", c.size, maxDatagram)
	}
	for _, s := range pattern {
		if need := c.headerLen(s) + stampLen; c.size < need {
			return fmt.Errorf("loadgen: size %d: %s datagrams need at least %d bytes", c.size, s, need)
		}
	}
	if err := (dtls.OrdinalFirst{Length: c.dtlsCIDLen}).Validate(); err != nil {
		return fmt.Errorf("loadgen: -cid-len: %w", err)
	}
	if err := (quic.LB{Length: c.quicCIDLen}).Validate(); err != nil {
		return fmt.Errorf("loadgen: -quic-cid-len: %w", err)
	}
	return nil
}

// template builds one datagram of shape s for a client whose connection
// IDs carry ordinal. The tail (the stamp's place) is overwritten per send.
func (c shapeConfig) template(s shape, ordinal uint8) ([]byte, error) {
	body := make([]byte, c.size-c.headerLen(s))
	for i := range body {
		body[i] = byte(i)
	}
	switch s {
	case dtlsCID:
		cid, err := dtls.OrdinalFirst{Length: c.dtlsCIDLen}.AppendCID(nil, ordinal)
		if err != nil {
			return nil, err
		}
		return dtls.AppendRecord(make([]byte, 0, c.size), dtls.Record{Type: dtls.TLS12CID, Epoch: 1, Seq: 1, CID: cid, Fragment: body})
	case dtlsHello:
		return dtls.AppendRecord(make([]byte, 0, c.size), dtls.Record{Type: dtls.Handshake,
			Fragment: dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, body)})
	case random:
		for i := range body {
			body[i] = byte(rand.Uint32())
		}
		// No DTLS record starts with 0–19 (content types 20–25, DTLS
		// 1.3's 001xxxxx). A QUIC service reads them as short headers
		// with a random DCID, an unknown ordinal mostly.
		body[0] = byte(rand.IntN(20))
		return body, nil
	default:
		// Short header: form 0, fixed bit 1, packet number length 2.
		b := append(make([]byte, 0, c.size), 0x41)
		b, err := quic.LB{Length: c.quicCIDLen}.AppendCID(b, ordinal)
		if err != nil {
			return nil, err
		}
		return append(b, body...), nil
	}
}
