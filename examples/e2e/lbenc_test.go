package e2e

// Encrypted QUIC-LB connection IDs (quic.LBEncrypted) end to end: quic-go
// connections that keep streaming through a whole key rotation, and
// pion/dtls sessions whose CIDs hide their backend.

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cidroute/cidroute"
	"github.com/cidroute/cidroute/dtls/piondtls/dtlsecho"
	"github.com/cidroute/cidroute/quic"
	"github.com/cidroute/cidroute/quic/quicgo/quicecho"
	"github.com/cidroute/cidroute/registry"
)

// The two configurations of a rotation from config ID 1 to 2.
var (
	lbKey1 = quic.LBKey{ConfigID: 1, Key: [16]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x01}}
	lbKey2 = quic.LBKey{ConfigID: 2, Key: [16]byte{0x02, 0x13, 0x24, 0x35, 0x46, 0x57, 0x68, 0x79, 0x8a, 0x9b, 0xac, 0xbd, 0xce, 0xdf, 0xe0, 0xf1}}
)

func lbEnc(t *testing.T, nonce int, active uint8, keys ...quic.LBKey) *quic.LBEncrypted {
	t.Helper()
	c, err := quic.NewLBEncrypted(quic.LBEncryptedConfig{NonceLen: nonce, Keys: keys, Active: active})
	require.NoError(t, err)
	return c
}

// setKeys applies one step of a rotation to every codec.
func setKeys(t *testing.T, cs []*quic.LBEncrypted, active uint8, keys ...quic.LBKey) {
	t.Helper()
	for _, c := range cs {
		require.NoError(t, c.SetKeys(keys, active))
	}
}

// configOf is the config rotation codepoint of a CID (plaintext in its
// first octet), or -1 for none yet.
func configOf(cid []byte) int {
	if len(cid) == 0 {
		return -1
	}
	return int(cid[0] >> 5)
}

// A streamer keeps a client's echo stream busy: it writes 1 KiB, reads it
// back and checks it, round after round, until stopped or an error ends
// the session.
type streamer struct {
	c      *quicClient
	rounds atomic.Int64
	err    error // set before done is closed
	done   chan struct{}
}

func startStreamer(c *quicClient, tag string, stop <-chan struct{}) *streamer {
	s := &streamer{c: c, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		msg := bytes.Repeat([]byte("rotation"), 128)
		got := make([]byte, len(msg))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond): // paced: the machine is shared
			}
			copy(msg, fmt.Sprintf("%s %06d ", tag, i))
			if _, err := c.stream.Write(msg); err != nil {
				s.err = fmt.Errorf("%s round %d: write: %w", tag, i, err)
				return
			}
			c.stream.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c.stream, got); err != nil {
				s.err = fmt.Errorf("%s round %d: read: %w", tag, i, err)
				return
			}
			if !bytes.Equal(got, msg) {
				s.err = fmt.Errorf("%s round %d: echo differs", tag, i)
				return
			}
			s.rounds.Add(1)
		}
	}()
	return s
}

// progress waits until every streamer has done k more rounds: the
// sessions go on through the step just taken.
func progress(t *testing.T, ss []*streamer, k int64, step string) {
	t.Helper()
	want := make([]int64, len(ss))
	for i, s := range ss {
		want[i] = s.rounds.Load() + k
	}
	deadline := time.Now().Add(30 * time.Second)
	for i, s := range ss {
		for s.rounds.Load() < want[i] {
			select {
			case <-s.done:
				require.NoError(t, s.err, "streamer %d stopped %s", i, step)
				require.FailNow(t, "streamer stopped", "streamer %d %s", i, step)
			case <-time.After(5 * time.Millisecond):
			}
			require.True(t, time.Now().Before(deadline), "streamer %d made no progress %s", i, step)
		}
	}
}

// TestQUICEncryptedKeyRotation: quic-go clients stream through two
// replicas to three quic-go backends issuing encrypted QUIC-LB CIDs,
// without a pause, while the keys rotate from config 1 to config 2 as
// quic.LBEncrypted.SetKeys describes: the proxies add config 2, the
// backends switch their generators to it one by one, the clients move to
// config-2 CIDs, and config 1 is retired. No session breaks: every round
// is echoed by the backend that owns the connection, which sees one
// connection per client and every byte.
//
// A client moves to a config-2 CID by connection migration (a new local
// address, as NAT rebinding gives, through the other replica): each
// migration puts an unused CID to work and retires the old one, which the
// backend replaces with a CID of its now active configuration; quic-go
// holds at most 4, so within 4 migrations the client uses a config-2 one.
// (A client that never migrates keeps its config-1 CIDs: config 1 may only
// be retired once no session uses it, after the longest session lifetime
// or, as here, once every client uses a config-2 CID.)
func TestQUICEncryptedKeyRotation(t *testing.T) {
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const nonce = quic.LBEncryptedDefaultNonceLen // 12-octet CIDs, four pass

	// Each backend has its own codec, as separate processes would.
	var srvs []*quicecho.Server
	var backendCodecs []*quic.LBEncrypted
	var bs []registry.Backend
	for ord := range uint8(3) {
		c := lbEnc(t, nonce, 1, lbKey1)
		s, err := quicecho.Listen(quicecho.Config{Ordinal: ord, Codec: c, TrustedProxies: loopback})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		srvs, backendCodecs = append(srvs, s), append(backendCodecs, c)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: s.Addr()})
	}
	proxyCodec := lbEnc(t, nonce, 1, lbKey1) // shared by the replicas: one SetKeys is every replica's reload
	rs := startServiceReplicas(t, 2, bs, cidroute.Service{RouterConfig: cidroute.RouterConfig{
		Protocol: cidroute.QUIC, PublicAddr: public, Codec: proxyCodec}})
	cidLen := proxyCodec.Len()

	stop := make(chan struct{})
	var ss []*streamer
	dial := func(i int, tag string) *quicClient {
		c := dialQUIC(t, ctx, rs[i%2].addr)
		c.sock.WatchQUICDCID(cidLen)
		ss = append(ss, startStreamer(c, fmt.Sprint(tag, i), stop))
		return c
	}
	stopped := false
	stopAll := func() {
		if !stopped {
			stopped = true
			close(stop)
			for _, s := range ss {
				<-s.done
			}
		}
	}

	const oldClients, newClients = 12, 4
	var cs []*quicClient
	for i := range oldClients {
		cs = append(cs, dial(i, "old"))
	}
	t.Cleanup(stopAll) // before the connections close (cleanups run last first)
	progress(t, ss, 5, "before the rotation")
	for i, c := range cs {
		require.Equal(t, 1, configOf(c.sock.DCID()), "client %d: %x", i, c.sock.DCID())
	}

	// 1. The proxies learn config 2; the backends still issue config 1.
	setKeys(t, []*quic.LBEncrypted{proxyCodec}, 1, lbKey1, lbKey2)
	progress(t, ss, 5, "after the proxies added config 2")

	// 2. The backends' generators switch to config 2, one at a time.
	for ord, c := range backendCodecs {
		setKeys(t, []*quic.LBEncrypted{c}, 2, lbKey1, lbKey2)
		progress(t, ss, 3, fmt.Sprint("after backend ", ord, " switched"))
	}
	for i := range newClients {
		cs = append(cs, dial(oldClients+i, "new"))
	}
	progress(t, ss, 5, "with new connections")
	for i, c := range cs[oldClients:] {
		require.Equal(t, 2, configOf(c.sock.DCID()), "new client %d starts on config 2: %x", i, c.sock.DCID())
	}

	// The old connections move to config-2 CIDs by migrating.
	migrations := 0
	for i, c := range cs[:oldClients] {
		for m := 0; configOf(c.sock.DCID()) != 2; m++ {
			require.Less(t, m, 6, "client %d still uses config 1 after %d migrations", i, m)
			c.migrate(t, ctx, rs[(i+m+1)%2].addr)
			c.sock.WatchQUICDCID(cidLen)
			migrations++
			progress(t, ss[i:i+1], 2, fmt.Sprint("after migration ", m, " of client ", i))
		}
	}
	t.Logf("%d old clients moved to config-2 CIDs in %d migrations", oldClients, migrations)

	// 3. Config 1 is retired everywhere: its CIDs are unroutable now.
	setKeys(t, append([]*quic.LBEncrypted{proxyCodec}, backendCodecs...), 2, lbKey2)
	progress(t, ss, 20, "after config 1 was retired")
	for i, c := range cs {
		require.Equal(t, 2, configOf(c.sock.DCID()), "client %d", i)
	}
	stopAll()
	for i, s := range ss {
		require.NoError(t, s.err, "client %d", i)
	}

	// The backends' view: one connection per client, that received every
	// round of it.
	total := 0
	for _, s := range srvs {
		total += len(s.Connections())
	}
	require.Equal(t, len(cs), total, "one backend connection per client: no session was re-created")
	for i, c := range cs {
		s, bc, ok := owner(srvs, c.first)
		require.True(t, ok, "client %d", i)
		assert.Equal(t, ss[i].rounds.Load()*1024, bc.Bytes, "client %d: every round reached backend %d", i, s.Ordinal())
	}
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
}

// TestDTLSEncryptedCIDs: the encrypted codec serves DTLS too. pion/dtls
// backends issue 8-octet encrypted CIDs (pion's ConnectionIDGenerator from
// dtls.Generator); sessions survive NAT rebinding onto the other replica;
// a rotation adds config 2 for new sessions while the old ones keep their
// config-1 CID (DTLS 1.2 never changes a session's CID), and config 1 is
// retired once they have ended.
func TestDTLSEncryptedCIDs(t *testing.T) {
	const nonce = 6 // 8-octet CIDs, the DTLS default length
	var srvs []*dtlsecho.Server
	var backendCodecs []*quic.LBEncrypted
	var bs []registry.Backend
	for ord := range uint8(3) {
		c := lbEnc(t, nonce, 1, lbKey1)
		s, err := dtlsecho.Listen(dtlsecho.Config{Ordinal: ord, Codec: c, PSK: testPSK, TrustedProxies: loopback, Prefix: fmt.Sprintf("%d|", ord)})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		srvs, backendCodecs = append(srvs, s), append(backendCodecs, c)
		bs = append(bs, registry.Backend{Ordinal: ord, Addr: s.Addr()})
	}
	proxyCodec := lbEnc(t, nonce, 1, lbKey1)
	rs := startServiceReplicas(t, 2, bs, cidroute.Service{RouterConfig: cidroute.RouterConfig{
		Protocol: cidroute.DTLS, PublicAddr: public, Codec: proxyCodec}})

	// session dials, asks once, and checks that the CID it uses carries
	// config and decodes, with the key, to the backend that answered.
	session := func(i int, config int) (*dtlsClient, int) {
		c := mustDialDTLS(t, rs[i%2].addr)
		msg := fmt.Sprint("client ", i)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err, "client %d", i)
		ord := answeredBy(t, reply, msg)
		cid := c.sock.CID()
		dec, ok := proxyCodec.Ordinal(cid)
		require.True(t, ok, "client %d: CID %x", i, cid)
		require.Equal(t, ord, int(dec), "client %d: the CID names the backend that answered", i)
		require.Equal(t, config, configOf(cid), "client %d: CID %x", i, cid)
		return c, ord
	}
	rebindAsk := func(i int, c *dtlsClient, ord int, step string) {
		require.NoError(t, c.sock.Rebind(rs[(i+1)%2].addr))
		msg := fmt.Sprint("client ", i, " ", step)
		reply, err := c.ask(msg, 5, replyWait)
		require.NoError(t, err, "client %d %s", i, step)
		require.Equal(t, ord, answeredBy(t, reply, msg), "client %d %s: same backend", i, step)
	}

	const n = 9
	var old []*dtlsClient
	var oldOwner []int
	for i := range n {
		c, ord := session(i, 1)
		old, oldOwner = append(old, c), append(oldOwner, ord)
	}

	setKeys(t, []*quic.LBEncrypted{proxyCodec}, 1, lbKey1, lbKey2)
	setKeys(t, backendCodecs, 2, lbKey1, lbKey2)
	var fresh []*dtlsClient
	var freshOwner []int
	for i := range n {
		c, ord := session(n+i, 2)
		fresh, freshOwner = append(fresh, c), append(freshOwner, ord)
	}
	for i, c := range old {
		rebindAsk(i, c, oldOwner[i], "config 1 after the switch")
	}
	// Config 1 is retired once its sessions have ended: their last
	// records (close_notify) still need it. A record with a retired
	// config's CID is unroutable, and the proxies hash it by client
	// address to some backend, which has no such session and drops it.
	for _, c := range old {
		require.NoError(t, c.conn.Close())
	}
	require.Eventually(t, func() bool {
		open := 0
		for _, ss := range sessionsOf(srvs) {
			for _, s := range ss {
				if s.Open {
					open++
				}
			}
		}
		return open == n
	}, 10*time.Second, 10*time.Millisecond, "the backends see the config-1 sessions end")
	setKeys(t, append([]*quic.LBEncrypted{proxyCodec}, backendCodecs...), 2, lbKey2)
	for i, c := range fresh {
		rebindAsk(n+i, c, freshOwner[i], "config 2 after config 1 was retired")
	}

	owners := map[int]bool{}
	for _, o := range append(oldOwner, freshOwner...) {
		owners[o] = true
	}
	assert.Len(t, owners, 3, "HRW spreads the sessions over all three backends")
	sessions := 0
	for _, s := range srvs {
		st, dm := s.Stats()
		sessions += int(dm.NewSessions)
		assert.Zero(t, dm.DroppedNoSession, "backend %d: a record for a session it does not own", s.Ordinal())
		assert.Zero(t, st.DroppedUntrusted+st.DroppedBadHeader, "backend %d", s.Ordinal())
	}
	assert.Equal(t, 2*n, sessions, "one session per client: rebinding created none")
	f := forward(rs)
	assert.Zero(t, f.DroppedTotal(), "no forward drops: %v", dropList(&f))
	t.Logf("records resent after a lost echo (pion's late peer-address update): %d", resent.Swap(0))
}
