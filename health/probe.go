package health

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls"
	"github.com/cidroute/cidroute/ppv2"
	"github.com/cidroute/cidroute/quic"
)

// Errors of a failed probe; test with errors.Is.
var (
	// ErrTimeout: no answer before the deadline.
	ErrTimeout = errors.New("health: no answer")
	// ErrRefused: the backend's host answered ICMP port unreachable.
	ErrRefused = errors.New("health: port unreachable")
	// ErrBadAnswer: something answered, but not the protocol's stack.
	ErrBadAnswer = errors.New("health: answer is not the protocol's")
	// ErrConfig: an invalid Config or ProbeConfig.
	ErrConfig = errors.New("health: invalid configuration")
)

// Result is the outcome of one probe, as a metric label.
type Result uint8

// Probe results.
const (
	OK        Result = iota // the backend's stack answered
	Timeout                 // ErrTimeout
	Refused                 // ErrRefused
	BadAnswer               // ErrBadAnswer
	Error                   // the probe could not be sent (no route, no socket)

	// NumResults is the number of Results: the size of
	// BackendStatus.Results.
	NumResults = iota
)

var resultNames = [NumResults]string{OK: "ok", Timeout: "timeout", Refused: "refused", BadAnswer: "bad_answer", Error: "error"}

// String returns the result's label: ok, timeout, refused, bad_answer or
// error.
func (r Result) String() string {
	if int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "invalid"
}

// ResultOf classifies the error Probe returned.
func ResultOf(err error) Result {
	switch {
	case err == nil:
		return OK
	case errors.Is(err, ErrTimeout):
		return Timeout
	case errors.Is(err, ErrRefused):
		return Refused
	case errors.Is(err, ErrBadAnswer):
		return BadAnswer
	}
	return Error
}

// ProbeConfig says how to probe. The zero value is invalid: Protocol is
// required.
type ProbeConfig struct {
	Protocol cidroute.Protocol // cidroute.DTLS or cidroute.QUIC
	// Direct sends the probe without the PPv2 LOCAL header, for backends
	// behind a proxy in transparent mode (no PROXY protocol). A DTLS
	// server that is not behind cidroute's backend adapter may keep a
	// half-open handshake for each such probe.
	Direct bool
	// CipherSuites are the DTLS cipher suites the ClientHello offers
	// (IANA numbers); nil means DefaultCipherSuites. A server that skips
	// the cookie exchange answers a hello it shares no suite with by an
	// alert, which fails the probe.
	CipherSuites []uint16
}

// DefaultCipherSuites are the suites a DTLS probe offers by default: the
// ECDHE, PSK and ECDHE-PSK suites of DTLS 1.2 that pion/dtls and OpenSSL
// implement.
var DefaultCipherSuites = []uint16{
	0xc02b, 0xc02f, 0xc02c, 0xc030, // ECDHE-{ECDSA,RSA}-AES{128,256}-GCM
	0xcca9, 0xcca8, // ECDHE-{ECDSA,RSA}-CHACHA20-POLY1305
	0xc0ac, 0xc0ae, // ECDHE-ECDSA-AES128-CCM, -CCM8
	0xc00a, 0xc014, // ECDHE-{ECDSA,RSA}-AES256-CBC-SHA
	0x00a8, 0xc0a4, 0xc0a8, 0xc0a9, 0x00ae, // PSK-AES128-GCM, -CCM, -CCM8, PSK-AES256-CCM8, PSK-AES128-CBC-SHA256
	0xc037, // ECDHE-PSK-AES128-CBC-SHA256
}

func (c *ProbeConfig) validate() error {
	switch {
	case c.Protocol != cidroute.DTLS && c.Protocol != cidroute.QUIC:
		return fmt.Errorf("%w: protocol %v", ErrConfig, c.Protocol)
	case c.CipherSuites != nil && (len(c.CipherSuites) == 0 || len(c.CipherSuites) > 1000):
		return fmt.Errorf("%w: %d cipher suites: want 1 to 1000 (nil: the defaults)", ErrConfig, len(c.CipherSuites))
	}
	return nil
}

// maxAnswer is the largest answer read: a ServerHello flight's first
// datagram or a Version Negotiation packet fit in far less.
const maxAnswer = 4096

// Probe sends one probe to the backend at addr and waits for its answer
// until ctx is done; it returns the round-trip time of a valid answer, or
// an error wrapping ErrTimeout, ErrRefused or ErrBadAnswer (or another
// error when the probe could not be sent). Probe is safe for concurrent
// use; each call has a socket of its own.
func Probe(ctx context.Context, addr netip.AddrPort, cfg ProbeConfig) (time.Duration, error) {
	rtt, _, err := ProbeAnswer(ctx, addr, cfg)
	return rtt, err
}

// Match says how a valid answer is tied to the probe it answers.
type Match uint8

const (
	// Untied: a plausible answer that echoes nothing of the probe (a
	// ServerHello; a HelloVerifyRequest from a stack that ignores RFC 6347
	// §4.2.2's record sequence number), which anyone able to send from
	// the backend's address could have forged.
	Untied Match = iota
	// Tied: the answer echoes random values of the probe (QUIC: both
	// connection IDs; DTLS: the ClientHello's record sequence number in
	// the HelloVerifyRequest).
	Tied
)

// ProbeAnswer is Probe, and says how the answer matched the probe.
func ProbeAnswer(ctx context.Context, addr netip.AddrPort, cfg ProbeConfig) (time.Duration, Match, error) {
	if err := cfg.validate(); err != nil {
		return 0, Untied, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return 0, Untied, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	p, err := newPayload(cfg)
	if err != nil {
		return 0, Untied, err
	}
	start := time.Now()
	if _, err := c.Write(p.datagram); err != nil {
		return 0, Untied, probeError(err)
	}
	buf := make([]byte, maxAnswer)
	n, err := c.Read(buf)
	if err != nil {
		return 0, Untied, probeError(err)
	}
	m, err := p.check(buf[:n])
	return time.Since(start), m, err
}

// probeError classifies a socket error of a probe.
func probeError(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ErrTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return err
}

// A payload is one probe's datagram and what its answer must say.
type payload struct {
	proto    cidroute.Protocol
	datagram []byte
	hello    []byte // DTLS: the ClientHello record
	dcid     []byte // QUIC: the probe's DCID, the answer's SCID
	scid     []byte // QUIC: the probe's SCID, the answer's DCID
	version  uint32 // QUIC: the probe's version, which the answer must not list
}

func newPayload(cfg ProbeConfig) (*payload, error) {
	p := &payload{proto: cfg.Protocol}
	var b []byte
	var err error
	if !cfg.Direct { // a proxy's own traffic: the LOCAL command
		if b, err = ppv2.AppendHeader(b, ppv2.Header{Command: ppv2.Local}); err != nil {
			return nil, err
		}
	}
	switch cfg.Protocol {
	case cidroute.DTLS:
		suites := cfg.CipherSuites
		if suites == nil {
			suites = DefaultCipherSuites
		}
		n := len(b)
		if b, err = AppendClientHello(b, suites); err != nil {
			return nil, err
		}
		p.hello = b[n:]
	case cidroute.QUIC:
		p.dcid, p.scid = randomBytes(16), randomBytes(8)
		p.version = reservedVersion()
		b = AppendVersionProbe(b, p.version, p.dcid, p.scid)
	}
	p.datagram = b
	return p, nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return b
}

// reservedVersion returns a random version of the form 0x?a?a?a?a, which
// RFC 9000 §15 reserves to force version negotiation.
func reservedVersion() uint32 { return rand.Uint32()&0xf0f0f0f0 | 0x0a0a0a0a }

// check validates an answer.
func (p *payload) check(b []byte) (Match, error) {
	if ppv2.Sniff(b) {
		return Untied, fmt.Errorf("%w: a PROXY header on the answer to LOCAL", ErrBadAnswer)
	}
	switch p.proto {
	case cidroute.DTLS:
		return CheckDTLSReply(b, p.hello)
	default:
		if err := CheckQUICAnswer(b, p.dcid, p.scid); err != nil {
			return Untied, err
		}
		// RFC 9000 §6.2: a Version Negotiation that lists the version
		// sent answers some other packet.
		for v := b[7+len(p.dcid)+len(p.scid):]; len(v) >= 4; v = v[4:] {
			if binary.BigEndian.Uint32(v) == p.version {
				return Untied, fmt.Errorf("%w: Version Negotiation listing the probe's own version %#x", ErrBadAnswer, p.version)
			}
		}
		return Tied, nil
	}
}

// AppendClientHello appends a DTLS probe's datagram to dst: one epoch-0
// handshake record (record version DTLS 1.0, as many clients send their
// first flight) with a random record sequence number, which a
// HelloVerifyRequest echoes (RFC 6347 §4.2.2), holding a ClientHello
// (message_seq 0) for DTLS 1.2 with a random random,
// no session ID, no cookie, the given cipher suites, the null compression
// method and the extensions an ECDHE handshake needs (supported groups,
// point formats, signature algorithms, extended master secret,
// renegotiation info). It fails with ErrConfig for more than 1000 suites.
func AppendClientHello(dst []byte, suites []uint16) ([]byte, error) {
	if len(suites) == 0 || len(suites) > 1000 {
		return dst, fmt.Errorf("%w: %d cipher suites: want 1 to 1000", ErrConfig, len(suites))
	}
	var body []byte
	body = binary.BigEndian.AppendUint16(body, dtls.VersionDTLS12)
	body = append(body, randomBytes(32)...)
	body = append(body, 0, 0) // session_id, cookie: empty
	body = binary.BigEndian.AppendUint16(body, uint16(2*len(suites)))
	for _, s := range suites {
		body = binary.BigEndian.AppendUint16(body, s)
	}
	body = append(body, 1, 0) // compression: null
	var ext []byte
	ext = appendExtension(ext, 10, []byte{0, 6, 0x00, 0x1d, 0x00, 0x17, 0x00, 0x18})                          // supported_groups: x25519, P-256, P-384
	ext = appendExtension(ext, 11, []byte{1, 0})                                                              // ec_point_formats: uncompressed
	ext = appendExtension(ext, 13, []byte{0, 10, 0x04, 0x03, 0x05, 0x03, 0x08, 0x04, 0x04, 0x01, 0x08, 0x07}) // signature_algorithms
	ext = appendExtension(ext, 23, nil)                                                                       // extended_master_secret
	ext = appendExtension(ext, 0xff01, []byte{0})                                                             // renegotiation_info
	body = binary.BigEndian.AppendUint16(body, uint16(len(ext)))
	body = append(body, ext...)
	hs := dtls.AppendHandshake(nil, dtls.HandshakeClientHello, 0, body)
	return dtls.AppendRecord(dst, dtls.Record{Type: dtls.Handshake, Version: dtls.VersionDTLS10, Seq: rand.Uint64() >> 16, Fragment: hs})
}

func appendExtension(dst []byte, typ uint16, data []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, typ)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(data)))
	return append(dst, data...)
}

// CheckDTLSAnswer reports whether b is a DTLS stack's answer to a
// ClientHello: its first record is an epoch-0 handshake record whose
// message is a HelloVerifyRequest or a ServerHello. An alert (no shared
// cipher suite) or anything else wraps ErrBadAnswer. It does not tie the
// answer to a probe: CheckDTLSReply does.
func CheckDTLSAnswer(b []byte) error {
	_, _, err := parseDTLSAnswer(b)
	return err
}

// CheckDTLSReply reports whether answer is a DTLS stack's answer to hello,
// a ClientHello record as AppendClientHello makes it, and how it is tied
// to it. A HelloVerifyRequest must be one unfragmented message_seq 0
// message of a DTLS version with a cookie of 1 to 255 bytes; it is Tied
// when its record sequence number is the hello's (RFC 6347 §4.2.2: the
// server MUST echo it; pion/dtls does not, cidroute's piondtls adapter
// does for probes). A ServerHello must choose a DTLS version, a cipher
// suite the hello offered and no compression; nothing in it echoes the
// hello, so it is Untied. Anything else wraps ErrBadAnswer.
func CheckDTLSReply(answer, hello []byte) (Match, error) {
	r, h, err := parseDTLSAnswer(answer)
	if err != nil {
		return Untied, err
	}
	q, _, err := dtls.ParseRecord(hello, dtls.MinCIDLen)
	if err != nil || len(q.Fragment) < 12+2+32+2 {
		return Untied, fmt.Errorf("%w: not a ClientHello record", ErrConfig)
	}
	bad := func(format string, args ...any) (Match, error) {
		return Untied, fmt.Errorf("%w: "+format, append([]any{ErrBadAnswer}, args...)...)
	}
	if h.fragOff != 0 || h.fragLen != h.length || len(h.body) != h.length {
		return bad("a fragmented or truncated %v", h.typ)
	}
	if !dtlsVersion(h.version()) {
		return bad("%v of version %#04x", h.typ, h.version())
	}
	switch h.typ {
	case dtls.HandshakeHelloVerifyRequest:
		if h.messageSeq != 0 {
			return bad("HelloVerifyRequest of message_seq %d answers no first ClientHello", h.messageSeq)
		}
		if len(h.body) < 3 || int(h.body[2]) == 0 || len(h.body) != 3+int(h.body[2]) {
			return bad("HelloVerifyRequest of %d bytes: want a cookie of 1 to 255 bytes, nothing after it", len(h.body))
		}
		if r.Seq != q.Seq {
			return Untied, nil
		}
		return Tied, nil
	default: // ServerHello: version, random, session_id, cipher_suite, compression
		b := h.body
		if len(b) < 2+32+1 || len(b) < 2+32+1+int(b[34])+3 || b[34] > 32 {
			return bad("a ServerHello of %d bytes", len(b))
		}
		b = b[2+32+1+int(b[34]):]
		if suite := binary.BigEndian.Uint16(b); !offers(q.Fragment[12:], suite) {
			return bad("a ServerHello choosing the cipher suite %#04x, which the probe did not offer", suite)
		}
		if b[2] != 0 {
			return bad("a ServerHello choosing compression %d", b[2])
		}
		return Untied, nil
	}
}

func dtlsVersion(v uint16) bool { return v == dtls.VersionDTLS12 || v == dtls.VersionDTLS10 }

// offers reports whether a ClientHello body offers suite.
func offers(body []byte, suite uint16) bool {
	p := 2 + 32
	if len(body) < p+1 {
		return false
	}
	p += 1 + int(body[p]) // session_id
	if len(body) < p+1 {
		return false
	}
	p += 1 + int(body[p]) // cookie
	if len(body) < p+2 {
		return false
	}
	n := int(binary.BigEndian.Uint16(body[p:]))
	suites := body[p+2 : min(len(body), p+2+n)]
	for i := 0; i+1 < len(suites); i += 2 {
		if binary.BigEndian.Uint16(suites[i:]) == suite {
			return true
		}
	}
	return false
}

// handshake is a parsed handshake message header; body aliases the
// record's fragment.
type handshake struct {
	typ                      dtls.HandshakeType
	length, fragOff, fragLen int
	messageSeq               uint16
	body                     []byte // up to fragLen bytes, as many as the record holds
}

func (h handshake) version() uint16 {
	if len(h.body) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(h.body)
}

// parseDTLSAnswer parses the first record of an answer and the header of
// its handshake message, which must be a HelloVerifyRequest or a
// ServerHello.
func parseDTLSAnswer(b []byte) (dtls.Record, handshake, error) {
	r, _, err := dtls.ParseRecord(b, dtls.MinCIDLen)
	switch {
	case err != nil:
		return r, handshake{}, fmt.Errorf("%w: %v", ErrBadAnswer, err)
	case r.Type != dtls.Handshake || r.Epoch != 0:
		return r, handshake{}, fmt.Errorf("%w: a %v record of epoch %d", ErrBadAnswer, r.Type, r.Epoch)
	case len(r.Fragment) < 12:
		return r, handshake{}, fmt.Errorf("%w: a handshake record of %d bytes", ErrBadAnswer, len(r.Fragment))
	}
	f := r.Fragment
	u24 := func(b []byte) int { return int(b[0])<<16 | int(b[1])<<8 | int(b[2]) }
	h := handshake{typ: dtls.HandshakeType(f[0]), length: u24(f[1:]), messageSeq: binary.BigEndian.Uint16(f[4:]),
		fragOff: u24(f[6:]), fragLen: u24(f[9:])}
	h.body = f[12:min(len(f), 12+h.fragLen)]
	switch h.typ {
	case dtls.HandshakeHelloVerifyRequest, dtls.HandshakeServerHello:
		return r, h, nil
	default:
		return r, h, fmt.Errorf("%w: handshake message type %d", ErrBadAnswer, h.typ)
	}
}

// AppendVersionProbe appends a QUIC probe's datagram to dst: a long header
// with the given version (one reserved for negotiation), dcid and scid,
// padded with zeros to quic.MinInitialDatagram bytes (servers ignore
// smaller ones).
func AppendVersionProbe(dst []byte, version uint32, dcid, scid []byte) []byte {
	start := len(dst)
	dst = append(dst, 0xc0)
	dst = binary.BigEndian.AppendUint32(dst, version)
	dst = append(dst, byte(len(dcid)))
	dst = append(dst, dcid...)
	dst = append(dst, byte(len(scid)))
	dst = append(dst, scid...)
	if n := len(dst) - start; n < quic.MinInitialDatagram {
		dst = append(dst, make([]byte, quic.MinInitialDatagram-n)...)
	}
	return dst
}

// CheckQUICAnswer reports whether b is a Version Negotiation packet
// answering a probe with the given connection IDs: version 0, the probe's
// scid as destination and dcid as source, and at least one version.
// Anything else wraps ErrBadAnswer.
func CheckQUICAnswer(b []byte, dcid, scid []byte) error {
	h, err := quic.ParseHeader(b, 0)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %v", ErrBadAnswer, err)
	case h.Type != quic.VersionNegotiation:
		return fmt.Errorf("%w: a %v packet", ErrBadAnswer, h.Type)
	case !bytes.Equal(h.DCID, scid) || !bytes.Equal(h.SCID, dcid):
		return fmt.Errorf("%w: Version Negotiation for other connection IDs", ErrBadAnswer)
	}
	versions := len(b) - (7 + len(h.DCID) + len(h.SCID))
	if versions < 4 || versions%4 != 0 {
		return fmt.Errorf("%w: Version Negotiation with a %d-byte version list", ErrBadAnswer, versions)
	}
	return nil
}
