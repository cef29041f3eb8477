package backend

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTrustedProxies(t *testing.T) {
	for in, want := range map[string]string{
		"":                                   "[]",
		" , ":                                "[]",
		"10.244.0.0/16":                      "[10.244.0.0/16]",
		"10.244.1.7, fd00::/8":               "[10.244.1.7/32 fd00::/8]",
		"10.244.3.9/16":                      "[10.244.0.0/16]",
		"127.0.0.0/8,::1/128":                "[127.0.0.0/8 ::1/128]",
		" 192.0.2.1 ,2001:db8::1 ,":          "[192.0.2.1/32 2001:db8::1/128]",
		"::ffff:10.0.0.0/104":                "[::ffff:10.0.0.0/104]",
		"10.0.0.0/8,10.1.0.0/16,10.1.0.0/16": "[10.0.0.0/8 10.1.0.0/16 10.1.0.0/16]",
	} {
		got, err := ParseTrustedProxies(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, fmt.Sprint(got), in)
	}
	for _, in := range []string{"10.0.0.0/33", "proxy.local", "10.0.0.0/8;10.1.0.0/16", "1.2.3.4:80"} {
		_, err := ParseTrustedProxies(in)
		assert.ErrorIs(t, err, ErrConfig, in)
		assert.ErrorContains(t, err, "neither a network", in)
	}
}

func TestDefaultTrustedProxies(t *testing.T) {
	d := DefaultTrustedProxies()
	c := newConn(t, Config{TrustedProxies: d})
	for ip, want := range map[string]bool{"127.0.0.1": true, "127.9.9.9": true, "::1": true, "::ffff:127.0.0.1": true,
		"10.0.0.1": false, "192.168.1.1": false, "fc00::1": false} {
		assert.Equal(t, want, c.isTrusted(netip.MustParseAddr(ip)), ip)
	}
	d[0] = netip.Prefix{}
	assert.True(t, DefaultTrustedProxies()[0].IsValid(), "a fresh slice each call")
}

func ExampleParseTrustedProxies() {
	// The proxies' pod network, as -trusted-proxies or an environment
	// variable would give it.
	trusted, err := ParseTrustedProxies("10.244.0.0/16, fd00:10:244::/64")
	fmt.Println(trusted, err)
	fmt.Println(DefaultTrustedProxies())
	// Output:
	// [10.244.0.0/16 fd00:10:244::/64] <nil>
	// [127.0.0.0/8 ::1/128]
}
