package quic

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cidroute/cidroute/internal/testtool"
)

// draftKey is the key of every encrypted test vector of
// draft-ietf-quic-load-balancers-21, Appendix B.2.
var draftKey = [16]byte{0x8f, 0x95, 0xf0, 0x92, 0x45, 0x76, 0x5f, 0x80, 0x25, 0x69, 0x34, 0xe5, 0x0c, 0x66, 0x20, 0x7f}

// The draft's encrypted CIDs: Appendix B.2 ("the server is configured to
// encode the CID length"), and the worked example of §5.4.2 with its own
// key. They cover single pass (8+8 octets), four pass with an odd length
// (3+4, 10+5) and an even one over 16 (9+9), and a server ID longer than
// the nonce, which needs the fourth decryption pass (10+5).
//
// B.2's last row is printed with cr_bits 3, but its first octet 0x12 says
// config 0 (and length 18): the test builds the first octet as printed
// (with config 3 it would be 0x72; the ciphertext does not depend on it).
var draftEncryptedVectors = []struct {
	name       string
	key        string
	cr         uint8
	sid, nonce string
	cid        string
	fourthPass bool
	printedCR  uint8 // the config ID the printed first octet carries
}{
	{"§5.4.2 example (3+4)", "fdf726a9893ec05c0632d3956680baf0", 0, "31441a", "9c69c275", "0767947d29be054a", false, 0},
	{"B.2 row 1 (3+4)", "", 0, "ed793a", "ee080dbf", "0720b1d07b359d3c", false, 0},
	{"B.2 row 2 (10+5, fourth pass)", "", 1, "ed793a51d49b8f5fab65", "ee080dbf48", "2fcc381bc74cb4fbad2823a3d1f8fed2", true, 1},
	{"B.2 row 3 (8+8, single pass)", "", 2, "ed793a51d49b8f5f", "ee080dbf48c0d1e5", "504dd2d05a7b0de9b2b9907afb5ecf8cc3", false, 2},
	{"B.2 row 4 (9+9)", "", 3, "ed793a51d49b8f5fab", "ee080dbf48c0d1e55d", "125779c9cc86beb3a3a4a3ca96fce4bfe0cdbc", false, 0},
}

func TestLBEncryptedDraftVectors(t *testing.T) {
	for _, v := range draftEncryptedVectors {
		t.Run(v.name, func(t *testing.T) {
			key := draftKey[:]
			if v.key != "" {
				key = testtool.Hex(t, v.key)
			}
			sid, nonce, want := testtool.Hex(t, v.sid), testtool.Hex(t, v.nonce), testtool.Hex(t, v.cid)
			c, ok := newLBCipher(key, len(sid), len(nonce))
			if !ok {
				t.Fatal("configuration refused")
			}
			if c.singlePass() != (len(sid)+len(nonce) == 16) {
				t.Fatalf("single pass %v for %d octets", c.singlePass(), c.n)
			}
			pt := cat(sid, nonce)
			if want[0]>>5 != v.printedCR || int(want[0]&0x1f) != len(pt) {
				t.Fatalf("printed first octet %#x", want[0])
			}
			// Server: first octet (config, self-encoded length), then the
			// encrypted server ID and nonce.
			cid := append([]byte{v.printedCR<<5 | byte(len(pt))}, make([]byte, len(pt))...)
			c.encrypt(cid[1:], pt)
			if !bytes.Equal(cid, want) {
				t.Fatalf("encrypt: %x\nwant      %x", cid, want)
			}
			// Load balancer: the server ID, with three passes when it fits
			// in the left half and four otherwise.
			got := make([]byte, len(sid))
			c.serverID(got, want[1:])
			if !bytes.Equal(got, sid) {
				t.Fatalf("server ID %x, want %x", got, sid)
			}
			if v.fourthPass {
				var sv, lb [lbBlockLen]byte
				l, _ := c.unwind(&sv, want[1:])
				l.store(lb[:])
				if bytes.Equal(lb[:len(sid)], sid) {
					t.Fatal("three passes recovered a server ID longer than the nonce")
				}
			}
			if c.firstOctet(want[1:]) != sid[0] {
				t.Fatal("firstOctet")
			}
			back := make([]byte, len(pt))
			c.decrypt(back, want[1:])
			if !bytes.Equal(back, pt) {
				t.Fatalf("decrypt: %x, want %x", back, pt)
			}
		})
	}
}

// TestLBCipherAllLengths: every server ID and nonce length the draft
// allows encrypts and decrypts back, and the ciphertext is not the
// plaintext.
func TestLBCipherAllLengths(t *testing.T) {
	for sidLen := 1; sidLen <= lbMaxPlaintextLen-lbMinNonceLen; sidLen++ {
		for nonceLen := lbMinNonceLen; sidLen+nonceLen <= lbMaxPlaintextLen; nonceLen++ {
			c, ok := newLBCipher(draftKey[:], sidLen, nonceLen)
			if !ok {
				t.Fatalf("%d+%d refused", sidLen, nonceLen)
			}
			for range 20 {
				pt := make([]byte, c.n)
				rand.Read(pt)
				ct := make([]byte, c.n)
				c.encrypt(ct, pt)
				back, sid := make([]byte, c.n), make([]byte, sidLen)
				c.decrypt(back, ct)
				c.serverID(sid, ct)
				if !bytes.Equal(back, pt) || !bytes.Equal(sid, pt[:sidLen]) || c.firstOctet(ct) != pt[0] || bytes.Equal(ct, pt) {
					t.Fatalf("%d+%d: %x → %x → %x (sid %x)", sidLen, nonceLen, pt, ct, back, sid)
				}
			}
		}
	}
	for _, l := range [][2]int{{0, 4}, {1, 3}, {1, 19}, {16, 4}} {
		if _, ok := newLBCipher(draftKey[:], l[0], l[1]); ok {
			t.Errorf("%d+%d accepted", l[0], l[1])
		}
	}
	if _, ok := newLBCipher(draftKey[:15], 1, 4); ok {
		t.Error("15-octet key accepted")
	}
}

// lbEncGolden are CIDs of the codec (1-octet server ID, self-encoded
// length, the draft's key) for every nonce length, with nonce octets
// i*37+nonceLen: computed once on amd64, they must come out the same on
// arm64 and big-endian s390x (.ci/run runs this package under qemu).
var lbEncGolden = []struct {
	nonceLen int
	config   uint8
	ordinal  uint8
	cid      string
}{
	{4, 4, 0, "85b64da27ba2"},
	{4, 4, 52, "857ca79d251c"},
	{4, 4, 254, "8559c637c01b"},
	{5, 5, 0, "a6233298b383fa"},
	{5, 5, 65, "a60fe83eb9c12e"},
	{5, 5, 254, "a6a6ee7d705b51"},
	{6, 6, 0, "c79634ae0721e634"},
	{6, 6, 78, "c76073e2a7e1c053"},
	{6, 6, 254, "c7bfef9692e75309"},
	{7, 0, 0, "082920a80009d863e7"},
	{7, 0, 91, "08826c5f31d94d4a94"},
	{7, 0, 254, "0826b2a3cdaf284154"},
	{8, 1, 0, "2991a2d03af89a001cf7"},
	{8, 1, 104, "292dca44772e66dac1c3"},
	{8, 1, 254, "296fb2dcc8881a056067"},
	{9, 2, 0, "4a7db5168d581ebcfdaeb0"},
	{9, 2, 117, "4ab5463fccea7643f60b9f"},
	{9, 2, 254, "4ae67a20bc490426182887"},
	{10, 3, 0, "6bef92874c3947bf31cac2c6"},
	{10, 3, 130, "6b1d706e73fe0640b9634362"},
	{10, 3, 254, "6b891a8ecaf7b55426e71ba8"},
	{11, 4, 0, "8c67d5dc00f423667d1891a47e"},
	{11, 4, 143, "8c5801e3105642936bbd94911d"},
	{11, 4, 254, "8caa1794c185df6a1d172532e9"},
	{12, 5, 0, "adce2737b9e7314900169648da06"},
	{12, 5, 156, "ad6ecac9dac3864504459815642a"},
	{12, 5, 254, "add775980148e4497a1c20556117"},
	{13, 6, 0, "cea34bbd754797e3883c97b48f1460"},
	{13, 6, 169, "ce4e4fbe63690f9d9c0f71d626d4e1"},
	{13, 6, 254, "ce79351858bb4d0c70e0a87992af2e"},
	{14, 0, 0, "0f2bc2bc3d67f89f8c610df430ca75aa"},
	{14, 0, 182, "0f78d96f564a9d374580a0ad9f6e7edf"},
	{14, 0, 254, "0f1286ccd42c7b4b7f73c4b7d0c65099"},
	{15, 1, 0, "30b2f7ba3a6b5aacdec664b92f87123663"},
	{15, 1, 195, "302a24b624d566f36cca9de7f964371650"},
	{15, 1, 254, "30e670cde167b7d491f402af826ab6298c"},
	{16, 2, 0, "519d2acad7243eaf05175dcc6fda8dad670a"},
	{16, 2, 208, "5148c68d73d0b2658a8b8db8ed3e08637296"},
	{16, 2, 254, "51994d1decd867680cbd14928a457e3325c0"},
	{17, 3, 0, "7275a49af154568860b37743c001da44369b78"},
	{17, 3, 221, "72453eaeddeacf6d75d04d7b7df5b781188579"},
	{17, 3, 254, "72de69b3ee2c0319ecd5dfe5a2bbffd284b258"},
	{18, 4, 0, "9375ea3680c45719851f8b1c19f38eb67ee5e5d5"},
	{18, 4, 234, "937fd30d964f2ef371ad7c99ab1479063552c291"},
	{18, 4, 254, "93352fa06b333a12947e6659ffcbe82d3fe405a6"},
}

func TestLBEncryptedGolden(t *testing.T) {
	for _, g := range lbEncGolden {
		c := mustLBEnc(t, LBEncryptedConfig{NonceLen: g.nonceLen, SelfEncodeLength: true, Keys: []LBKey{{g.config, draftKey}}, Active: g.config})
		cid := make([]byte, c.Len())
		for i := range cid {
			cid[i] = byte(i*37 + g.nonceLen)
		}
		c.encode(cid, c.set.Load().byID[g.config], g.config, g.ordinal)
		if got := hex.EncodeToString(cid); got != g.cid {
			t.Errorf("nonce %d, ordinal %d: %s, want %s", g.nonceLen, g.ordinal, got, g.cid)
		}
		if ord, ok := c.Ordinal(testtool.Hex(t, g.cid)); !ok || ord != g.ordinal {
			t.Errorf("nonce %d: %s decodes to %d, %v", g.nonceLen, g.cid, ord, ok)
		}
	}
}

func mustLBEnc(t testing.TB, cfg LBEncryptedConfig) *LBEncrypted {
	t.Helper()
	c, err := NewLBEncrypted(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func keyOf(b byte) [16]byte {
	var k [16]byte
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func TestLBEncryptedRoundTrip(t *testing.T) {
	for nl := LBMinNonceLen; nl <= LBMaxNonceLen; nl++ {
		for _, self := range []bool{false, true} {
			id := uint8(nl % 7)
			c := mustLBEnc(t, LBEncryptedConfig{NonceLen: nl, SelfEncodeLength: self, Keys: []LBKey{{id, keyOf(byte(nl))}}, Active: id})
			if c.Len() != nl+2 || c.SinglePass() != (nl == LBSinglePassNonceLen) || c.OrdinalOffset() != -1 {
				t.Fatalf("nonce %d: Len %d, single pass %v", nl, c.Len(), c.SinglePass())
			}
			seen := map[string]bool{}
			plain := make([]int, c.Len()) // per offset: CIDs showing their ordinal there
			for ord := range 255 {
				cid, err := c.AppendCID(nil, uint8(ord))
				if err != nil {
					t.Fatal(err)
				}
				if len(cid) != c.Len() || cid[0]>>5 != id || (self && int(cid[0]&0x1f) != c.Len()-1) {
					t.Fatalf("nonce %d: %x", nl, cid)
				}
				if got, ok := c.Ordinal(cid); !ok || got != uint8(ord) {
					t.Fatalf("nonce %d: Ordinal(%x) = %d, %v; want %d", nl, cid, got, ok, ord)
				}
				if seen[string(cid)] {
					t.Fatalf("nonce %d: %x issued twice", nl, cid)
				}
				seen[string(cid)] = true
				for i := 1; i < len(cid); i++ {
					if cid[i] == uint8(ord) {
						plain[i]++
					}
				}
			}
			// No octet carries the ordinal: chance agreement is 1 in 256.
			for i, n := range plain {
				if n > 8 {
					t.Fatalf("nonce %d: octet %d equals the ordinal in %d of 255 CIDs", nl, i, n)
				}
			}
		}
	}
	// AppendCID appends.
	c := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{0, draftKey}}})
	b, err := c.AppendCID([]byte("xy"), 9)
	if err != nil || len(b) != 14 || string(b[:2]) != "xy" {
		t.Fatalf("%x %v", b, err)
	}
	if ord, ok := c.Ordinal(b[2:]); !ok || ord != 9 {
		t.Fatal(ord, ok)
	}
}

// TestLBEncryptedRotation walks the rotation of SetKeys' documentation on
// one codec per side.
func TestLBEncryptedRotation(t *testing.T) {
	k1, k2 := keyOf(1), keyOf(2)
	proxy := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{1, k1}}, Active: 1})
	server := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{1, k1}}, Active: 1})
	old, _ := server.AppendCID(nil, 7)
	if old[0]>>5 != 1 {
		t.Fatalf("%x", old)
	}
	decodes := func(c *LBEncrypted, cid []byte) bool { ord, ok := c.Ordinal(cid); return ok && ord == 7 }

	// 1. The proxy learns config 2.
	if err := proxy.SetKeys([]LBKey{{2, k2}, {1, k1}}, 1); err != nil {
		t.Fatal(err)
	}
	if !decodes(proxy, old) || fmt.Sprint(proxy.ConfigIDs()) != "[1 2]" {
		t.Fatal("config 1 lost when adding 2")
	}
	// 2. The server switches.
	if err := server.SetKeys([]LBKey{{1, k1}, {2, k2}}, 2); err != nil {
		t.Fatal(err)
	}
	fresh, _ := server.AppendCID(nil, 7)
	if fresh[0]>>5 != 2 || server.Active() != 2 || !decodes(proxy, fresh) || !decodes(proxy, old) {
		t.Fatalf("after the switch: %x, %x", old, fresh)
	}
	// Each config has its own key: the same octets under the other
	// config ID decode to something else (or 7 by chance, 1 in 256).
	other := 0
	for range 64 {
		c, _ := server.AppendCID(nil, 7)
		c[0] = 1<<5 | c[0]&0x1f
		if !decodes(proxy, c) {
			other++
		}
	}
	if other < 60 {
		t.Fatalf("config 2 CIDs read with key 1 still gave ordinal 7 in %d of 64", 64-other)
	}
	// 3. Config 1 retired: its CIDs are unroutable, config 2's are not.
	if err := proxy.SetKeys([]LBKey{{2, k2}}, 2); err != nil {
		t.Fatal(err)
	}
	if _, ok := proxy.Ordinal(old); ok {
		t.Fatal("a retired config's CID decodes")
	}
	if !decodes(proxy, fresh) {
		t.Fatal("config 2 lost")
	}
	// 0b111 is never routable, and codepoints without a key are not.
	for cr := range uint8(8) {
		c := bytes.Clone(fresh)
		c[0] = cr<<5 | c[0]&0x1f
		if _, ok := proxy.Ordinal(c); ok != (cr == 2) {
			t.Errorf("config %d: routable %v", cr, ok)
		}
	}
}

func TestLBEncryptedUnroutable(t *testing.T) {
	c := mustLBEnc(t, LBEncryptedConfig{SelfEncodeLength: true, Keys: []LBKey{{0, draftKey}}})
	cid, _ := c.AppendCID(nil, 3)
	for _, bad := range [][]byte{nil, {}, cid[:1], cid[:11], append(bytes.Clone(cid), 0)} {
		if _, ok := c.Ordinal(bad); ok {
			t.Errorf("%x decodes", bad)
		}
	}
	wrongLen := bytes.Clone(cid)
	wrongLen[0] ^= 0x01
	if _, ok := c.Ordinal(wrongLen); ok {
		t.Error("wrong self-encoded length decodes")
	}
	// Without self-encoding the low bits are random and ignored.
	r := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{0, draftKey}}})
	cid, _ = r.AppendCID(nil, 3)
	cid[0] ^= 0x1f
	if ord, ok := r.Ordinal(cid); !ok || ord != 3 {
		t.Error("random low bits change the ordinal")
	}
	var zero LBEncrypted
	if _, ok := zero.Ordinal(cid); ok || zero.Len() != 0 {
		t.Error("zero value decodes")
	}
	if _, err := zero.AppendCID(nil, 1); !errors.Is(err, ErrLBConfig) {
		t.Error(err)
	}
}

// TestLBEncryptedRandomCIDs: what encryption does not protect. A random
// CID with a configured config ID decodes to some ordinal, evenly spread.
func TestLBEncryptedRandomCIDs(t *testing.T) {
	c := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{0, draftKey}}})
	var hits [256]int
	const n = 256 * 64
	for range n {
		cid := make([]byte, c.Len())
		rand.Read(cid)
		cid[0] &= 0x1f
		ord, ok := c.Ordinal(cid)
		if !ok {
			t.Fatal("random CID of config 0 unroutable")
		}
		hits[ord]++
	}
	for ord, h := range hits {
		if h < 64/4 || h > 64*4 {
			t.Fatalf("ordinal %d hit %d times of %d (expected about 64)", ord, h, n)
		}
	}
}

func TestLBEncryptedErrors(t *testing.T) {
	k := []LBKey{{0, draftKey}}
	for _, cfg := range []LBEncryptedConfig{
		{NonceLen: 3, Keys: k},
		{NonceLen: 19, Keys: k},
		{NonceLen: -1, Keys: k},
		{},
		{Keys: []LBKey{{7, draftKey}}, Active: 7},
		{Keys: []LBKey{{9, draftKey}}, Active: 9},
		{Keys: []LBKey{{1, draftKey}, {1, keyOf(3)}}, Active: 1},
		{Keys: k, Active: 1},
		{Keys: k, Active: 7},
	} {
		if _, err := NewLBEncrypted(cfg); !errors.Is(err, ErrLBConfig) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	c := mustLBEnc(t, LBEncryptedConfig{Keys: k})
	if err := c.SetKeys(nil, 0); !errors.Is(err, ErrLBConfig) {
		t.Error(err)
	}
	if err := c.SetKeys([]LBKey{{2, draftKey}}, 0); !errors.Is(err, ErrLBConfig) || c.Active() != 0 || fmt.Sprint(c.ConfigIDs()) != "[0]" {
		t.Errorf("a refused SetKeys changed the codec: %v, %v", err, c)
	}
	dst := []byte("keep")
	if b, err := c.AppendCID(dst, 255); !errors.Is(err, ErrReservedOrdinal) || string(b) != "keep" {
		t.Fatalf("ordinal 255: %q %v", b, err)
	}
}

// TestLBEncryptedKeyNotPrinted: printing a configuration or the codec,
// in any verb, never shows the key.
func TestLBEncryptedKeyNotPrinted(t *testing.T) {
	cfg := LBEncryptedConfig{Keys: []LBKey{{3, draftKey}}, Active: 3}
	c := mustLBEnc(t, cfg)
	secret := hex.EncodeToString(draftKey[:])
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x"} {
		for _, v := range []any{cfg, cfg.Keys[0], c} {
			out := fmt.Sprintf(verb, v)
			if bytes.Contains([]byte(out), []byte(secret)) || bytes.Contains([]byte(out), []byte(fmt.Sprint(draftKey[:4]))) ||
				bytes.Contains([]byte(out), []byte(fmt.Sprintf("%d, %d, %d", draftKey[0], draftKey[1], draftKey[2]))) {
				t.Errorf("%s of %T shows the key: %s", verb, v, out)
			}
		}
	}
	if got := c.String(); got != "QUIC-LB encrypted, 12 octets (four-pass), configs [3], active 3" {
		t.Error(got)
	}
}

func TestLBEncryptedNoAllocs(t *testing.T) {
	for _, nl := range []int{LBEncryptedDefaultNonceLen, LBSinglePassNonceLen, 5} {
		c := mustLBEnc(t, LBEncryptedConfig{NonceLen: nl, Keys: []LBKey{{1, draftKey}, {2, keyOf(2)}}, Active: 2})
		cid, _ := c.AppendCID(nil, 9)
		bad := bytes.Clone(cid)
		bad[0] |= 0xe0
		buf := make([]byte, 0, MaxCIDLen)
		for name, f := range map[string]func(){
			"Ordinal":   func() { _, _ = c.Ordinal(cid); _, _ = c.Ordinal(bad); _, _ = c.Ordinal(cid[:3]) },
			"AppendCID": func() { buf, _ = c.AppendCID(buf[:0], 9) },
		} {
			if n := testing.AllocsPerRun(100, f); n != 0 {
				t.Errorf("nonce %d: %s: %v allocs per run", nl, name, n)
			}
		}
	}
}

// TestLBEncryptedConcurrentSetKeys: decoding while keys change sees either
// the old set or the new one (run with -race).
func TestLBEncryptedConcurrentSetKeys(t *testing.T) {
	k1, k2 := keyOf(1), keyOf(2)
	c := mustLBEnc(t, LBEncryptedConfig{Keys: []LBKey{{1, k1}}, Active: 1})
	cid1, _ := c.AppendCID(nil, 42)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if ord, ok := c.Ordinal(cid1); !ok || ord != 42 {
					t.Error("config 1 CID lost during rotation")
					return
				}
				cid, err := c.AppendCID(nil, 43)
				if err != nil {
					t.Error(err)
					return
				}
				if ord, ok := c.Ordinal(cid); !ok || ord != 43 {
					t.Errorf("own CID %x decodes to %d, %v", cid, ord, ok)
					return
				}
			}
		}()
	}
	for i := range 2000 {
		active := uint8(1 + i%2)
		if err := c.SetKeys([]LBKey{{1, k1}, {2, k2}}, active); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
}
