// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// The cidroute XDP fast path: SPEC.md's routing table for PPv2 mode, run in
// the driver hook. Forward: a client datagram to a service address is
// classified (DTLS records, QUIC packets) exactly as package cidroute's
// Router does, routed by the CID's ordinal or by the same weighted HRW
// (hrw's bucket table and seeded XXH64), given a PROXY v2 header and sent to
// the backend. Reverse: a backend's reply to the proxy's upstream port is
// checked as Router.Reverse checks it, stripped and sent to the client.
//
// Whatever this program is not sure to decide exactly as the Go pipeline
// would goes up with XDP_PASS to the pipeline's sockets: fragments, IP
// options, IPv6 extension headers, VLAN tags, bad or missing checksums,
// PPv2 TLVs, codecs it does not know, services with admission limits, and
// anything a bound below cuts short. Only the path differs, never the
// verdict.
//
// The layout of every map value is mirrored in ../maps.go.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_UDP 17

#define MAX_SERVICES 64
#define BUCKET_BITS 14
#define BUCKETS (1 << BUCKET_BITS)
#define ADDR_SLOTS 1024 // reverse lookup table, power of two
#define ADDR_PROBES 16  // longest probe; the loader flags a table that needs more

// Bounds on the walks: more than this goes up to the Go pipeline.
#define MAX_DTLS_RECORDS 32
#define MAX_QUIC_PACKETS 8
#define MAX_PAYLOAD 4096 // checksummed payload; larger datagrams go up

// Drop reasons, as package cidroute numbers them; REASON_PASSED counts what
// went up.
enum {
	R_FORWARDED = 0,
	R_MALFORMED = 1,
	R_UNKNOWN_ORDINAL = 2,
	R_NOT_SERVING = 3,
	R_NO_READY_BACKEND = 4,
	R_STALE_REGISTRY = 5,
	R_UNTRUSTED_SENDER = 7,
	R_BAD_PROXY_HEADER = 8,
	R_BAD_DESTINATION = 9,
	R_UNROUTABLE = 12,
	R_OWN_ADDRESS = 13,
	R_CID_LENGTH = 15,
	R_PASSED = 31,
	NUM_SLOTS = 32,
	R_PASS = 255, // internal: hand the datagram to the stack
};

enum { DIR_FORWARD = 0, DIR_REVERSE = 1 };
enum { PROTO_DTLS = 1, PROTO_QUIC = 2 };
enum { CODEC_ORDINAL_FIRST = 1, CODEC_QUIC_LB = 2 };
enum { STATE_READY = 0, STATE_DRAINING = 1, STATE_GONE = 2 };

// An address in hrw's 16-byte form (IPv4 as ::ffff:a.b.c.d) and a port in
// host order.
struct addr {
	__u8 ip[16];
	__u16 port;
	__u16 pad;
} __attribute__((aligned(4))); // is4 reads words

struct svc_key {
	struct addr a; // the destination the client sent to
};

struct svc_cfg {
	__u32 id;         // index of the service in snaps, stale, counters
	__u8 proto;       // PROTO_*
	__u8 codec;       // CODEC_*
	__u8 cid_len;     // the codec's length, which the classifier uses too
	__u8 lb_config;   // QUIC-LB config rotation
	__u8 lb_self;     // QUIC-LB self-encoded length
	__u8 measured;    // the public address is a wildcard
	__u8 pass;        // hand every datagram up (limits, unknown codec)
	__u8 lb_hash;     // RouterConfig.Unroutable is UnroutableHash
	__u16 max_dgram;  // larger payloads are the pipeline's (malformed)
	__u16 up_port;    // source port of forwarded datagrams
	struct addr pub;  // the Router's service address (HRW key, PPv2)
	struct addr listen;
};

// A backend's own is the forward rule's own-address test (Router.Forward's
// OwnAddress) for its address, worked out by the loader, which writes the
// snapshot again when the host's addresses or the services change: OWN_YES
// at the service's public address, a service's listen address or a
// wildcard service's port on this host; OWN_PASS at another address of this
// host (an upstream port or a socket the program does not know: the
// pipeline's own set decides).
enum { OWN_NO = 0, OWN_YES = 1, OWN_PASS = 2 };

struct backend {
	__u8 ip[16];
	__u16 port;
	__u8 state;   // STATE_*
	__u8 present; // 1 when the snapshot has this ordinal
	__u8 own;     // OWN_*
	__u8 pad;
};

// One registry snapshot. A new one goes into a new inner map that replaces
// the old in snaps at once, so no datagram sees half of one.
struct snap {
	__u64 seed;
	__u32 nready;   // hrw candidates; 0 means no table
	__u32 rev_pass; // the address table overflowed: replies go up
	__u8 owner[BUCKETS];
	struct backend be[256];
	__u8 slots[ADDR_SLOTS]; // serving backends by address, 0xff empty
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SERVICES * 4);
	__type(key, struct svc_key);
	__type(value, struct svc_cfg);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES);
	__type(key, __u32);
	__type(value, struct svc_cfg);
} service_by_id SEC(".maps");

// Upstream port → service id: replies arrive there.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u16);
	__type(value, __u32);
} upstreams SEC(".maps");

// The proxy's own addresses (16-byte form).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u8[16]);
	__type(value, __u8);
} locals SEC(".maps");

// The prefixes of the host's local routes (cidroute.LocalNets, e.g. an
// AnyIP pool `ip route add local 10.77.0.0/24 dev lo`): every address in
// them is the host's. Key: prefix length over the 16-byte form.
struct net_key {
	__u32 prefixlen;
	__u8 ip[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct net_key);
	__type(value, __u8);
} local_nets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_SERVICES);
	__type(key, __u32);
	__type(value, __u32);
} stale SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, MAX_SERVICES);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(max_entries, 1);
		__uint(key_size, sizeof(__u32));
		__uint(value_size, sizeof(struct snap));
	});
} snaps SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_SERVICES * 2 * NUM_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// The MAC address of each interface the program is attached to: a frame
// for another host (a promiscuous interface) is not ours to answer.
struct mac {
	__u8 a[6];
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct mac);
} macs SEC(".maps");

// Global settings, written once by the loader.
struct config {
	__u32 rp_filter; // 1 strict, 2 loose: check the client's source route
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} settings SEC(".maps");

// What emit writes: addresses in 16-byte form, ports in host order.
struct out {
	__u8 src[16];
	__u8 dst[16];
	__u16 sport;
	__u16 dport;
	__u32 plen; // payload bytes
	__u64 psum; // their partial sum
};

// Per-CPU scratch: XDP does not nest on one CPU, and the stack is too small
// for keys of 255 bytes and what a transmit needs.
struct scratch {
	__u8 key[264];
	__u8 b[64];
	__u8 hdr[56];
	struct out o;
	__u8 f[sizeof(struct bpf_fib_lookup)] __attribute__((aligned(8))); // a struct bpf_fib_lookup
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scratch);
} scratch SEC(".maps");

static __always_inline void count(__u32 id, __u32 dir, __u32 reason)
{
	__u32 k = (id * 2 + dir) * NUM_SLOTS + (reason & (NUM_SLOTS - 1));
	__u64 *c = bpf_map_lookup_elem(&counters, &k);
	if (c)
		*c += 1;
}

// ---- XXH64, as package hrw computes it ---------------------------------

#define P1 11400714785074694791ULL
#define P2 14029467366897019727ULL
#define P3 1609587929392839161ULL
#define P4 9650029242287828579ULL
#define P5 2870177450012600261ULL

static __always_inline __u64 rotl(__u64 x, int r) { return (x << r) | (x >> (64 - r)); }

static __always_inline __u64 xround(__u64 acc, __u64 in) { return rotl(acc + in * P2, 31) * P1; }

static __always_inline __u64 merge(__u64 acc, __u64 v) { return (acc ^ xround(0, v)) * P1 + P4; }

// Little-endian loads by bytes, so that bpfeb computes the same hash.
static __always_inline __u64 le64(const __u8 *p)
{
	return (__u64)p[0] | (__u64)p[1] << 8 | (__u64)p[2] << 16 | (__u64)p[3] << 24 |
	       (__u64)p[4] << 32 | (__u64)p[5] << 40 | (__u64)p[6] << 48 | (__u64)p[7] << 56;
}

static __always_inline __u32 le32(const __u8 *p)
{
	return (__u32)p[0] | (__u32)p[1] << 8 | (__u32)p[2] << 16 | (__u32)p[3] << 24;
}

// xxh64 hashes the first n (≤ 255) bytes of key.
static __noinline __u64 xxh64(const __u8 *key, __u32 n, __u64 seed)
{
	__u64 h;
	__u32 off = 0;
	if (!key)
		return 0;
	n &= 0xff;
	if (n >= 32) {
		__u64 v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
		for (int i = 0; i < 8; i++) {
			if (off + 32 > n)
				break;
			const __u8 *p = key + (off & 0xff);
			v1 = xround(v1, le64(p));
			v2 = xround(v2, le64(p + 8));
			v3 = xround(v3, le64(p + 16));
			v4 = xround(v4, le64(p + 24));
			off += 32;
		}
		h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
		h = merge(h, v1);
		h = merge(h, v2);
		h = merge(h, v3);
		h = merge(h, v4);
	} else {
		h = seed + P5;
	}
	h += n;
	for (int i = 0; i < 4; i++) {
		if (off + 8 > n)
			break;
		h ^= xround(0, le64(key + (off & 0xff)));
		h = rotl(h, 27) * P1 + P4;
		off += 8;
	}
	if (off + 4 <= n) {
		h ^= (__u64)le32(key + (off & 0xff)) * P1;
		h = rotl(h, 23) * P2 + P3;
		off += 4;
	}
	for (int i = 0; i < 3; i++) {
		if (off >= n)
			break;
		h ^= (__u64)key[off & 0xff] * P5;
		h = rotl(h, 11) * P1;
		off++;
	}
	h ^= h >> 33;
	h *= P2;
	h ^= h >> 29;
	h *= P3;
	h ^= h >> 32;
	return h;
}

// ---- classification -------------------------------------------------------

enum { KIND_NEW = 1, KIND_ESTABLISHED = 2 };

// A class: the kind and the routing ID, an offset into the UDP payload (or
// none for DTLS without CID).
struct cls {
	__u32 ord; // out: decide's ordinal
	__u32 kind;
	__u32 id_off;
	__u32 id_len;
	__u32 has_id;
};

// BOUNDED(k, mask) is k for k in 1..mask+1 (mask = 2^i - 1), written so
// that the verifier sees those bounds where a helper takes k as a size.
#define BOUNDED(k, mask)                           \
	({                                         \
		__u32 __k = (k);                   \
		asm volatile("" : "+r"(__k));      \
		((__k - 1) & (mask)) + 1;          \
	})

// load copies n (a constant) bytes at frame offset off to dst: 0, or
// nonzero past the frame's end. The program takes no fragments, so the
// frame is data..data_end and a direct copy is what bpf_xdp_load_bytes
// would do, without a helper call; offsets past 8191 (more than any
// frame the program decides) fail.
static __always_inline int load(struct xdp_md *ctx, __u32 off, void *dst, __u32 n)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (off > 0x1fff)
		return -1;
	asm volatile("" : "+r"(off));
	__u8 *p = data + (off & 0x1fff);
	if ((void *)(p + n) > end)
		return -1;
	__builtin_memcpy(dst, p, n);
	return 0;
}

// load_var is load for a size the verifier knows only by its bounds.
static __always_inline int load_var(struct xdp_md *ctx, __u32 off, void *dst, __u32 n)
{
	return bpf_xdp_load_bytes(ctx, off, dst, n);
}

// classify_dtls is dtls.Classify for DTLS 1.2 records: 0 and *c on
// success, R_MALFORMED, or R_PASS past MAX_DTLS_RECORDS or at a DTLS 1.3
// record. p is the payload's offset in the frame.
__noinline int classify_dtls(struct xdp_md *ctx, __u32 p, __u32 n, __u32 cid_len, struct cls *c)
{
	__u8 h[13];
	__u32 off = 0;
	int found = 0;
	if (!c || cid_len < 1 || cid_len > 255 || n > 0xffff)
		return R_PASS;
	if (n == 0)
		return R_MALFORMED;
	for (int i = 0; i < MAX_DTLS_RECORDS; i++) {
		if (off >= n)
			break;
		__u32 rem = n - off;
		// DTLS 1.3 (RFC 9147): a unified header (001xxxxx), which may be
		// shorter than 13 bytes, or a plaintext ACK (26) goes up to the
		// pipeline, which reads them.
		if (rem < 13) {
			__u8 b0;
			if (load(ctx, p + off, &b0, 1))
				return R_PASS;
			return (b0 & 0xe0) == 0x20 ? R_PASS : R_MALFORMED;
		}
		if (load(ctx, p + off, h, 13))
			return R_PASS;
		if ((h[0] & 0xe0) == 0x20 || h[0] == 26)
			return R_PASS;
		if (((__u16)h[1] << 8 | h[2] | 2) != 0xfeff)
			return R_MALFORMED;
		__u32 hl = 13;
		__u8 len[2] = {h[11], h[12]};
		// A first tls12_cid record that does not fit may carry a CID
		// of another length (dtls.MismatchedCID): the pipeline tells.
		int first_cid = h[0] == 25 && !found;
		if (h[0] == 25) {
			hl += cid_len;
			if (rem < hl)
				return first_cid ? R_PASS : R_MALFORMED;
			if (!found) {
				found = 1;
				c->id_off = off + 11;
			}
			if (load(ctx, p + off + hl - 2, len, 2))
				return R_PASS;
		} else if (h[0] < 20 || h[0] > 23) {
			return R_MALFORMED;
		}
		__u32 l = (__u32)len[0] << 8 | len[1];
		if (l == 0 || l > rem - hl)
			return first_cid ? R_PASS : R_MALFORMED;
		off += hl + l;
	}
	if (off < n)
		return R_PASS;
	c->kind = found ? KIND_ESTABLISHED : KIND_NEW;
	c->has_id = found;
	c->id_len = found ? cid_len : 0;
	return 0;
}

enum { T_INITIAL = 1, T_ZERORTT, T_HANDSHAKE, T_RETRY, T_VN, T_SHORT, T_UNKNOWN };

struct qpkt {
	__u32 cid_len;  // in: the server CID length
	__u32 typ;
	__u32 dcid_off; // in the payload
	__u32 dcid_len;
	__u32 len;      // bytes the packet takes
};

// varint reads a QUIC variable-length integer at payload offset off of a
// payload of n bytes; 0 when truncated, else its length.
static __always_inline int varint(struct xdp_md *ctx, __u32 p, __u32 off, __u32 n, __u64 *v)
{
	__u8 b[8];
	if (off >= n)
		return 0;
	if (load(ctx, p + off, b, 1))
		return -1;
	__u32 k = 1 << (b[0] >> 6);
	if (n - off < k)
		return 0;
	__u64 x = b[0] & 0x3f;
	if (k > 1) {
		if (k == 2) {
			if (load(ctx, p + off, b, 2))
				return -1;
		} else if (k == 4) {
			if (load(ctx, p + off, b, 4))
				return -1;
		} else {
			if (load(ctx, p + off, b, 8))
				return -1;
		}
		for (int i = 1; i < 8; i++) {
			if (i >= k)
				break;
			x = x << 8 | b[i];
		}
	}
	*v = x;
	return k;
}

// scan_quic is quic's scan of the packet at payload offset off (n bytes of
// payload in all): 0 and *q, R_MALFORMED, or R_PASS.
__noinline int scan_quic(struct xdp_md *ctx, __u32 p, __u32 off, __u32 n, struct qpkt *q)
{
	__u8 h[7];
	if (!q)
		return R_PASS;
	__u32 cid_len = q->cid_len;
	if (cid_len > 20 || n > 0xffff || off > n)
		return R_PASS;
	__u32 rem = n - off;
	if (rem == 0)
		return R_MALFORMED;
	if (load(ctx, p + off, h, 1))
		return R_PASS;
	if (!(h[0] & 0x80)) {
		if (rem < 1 + cid_len + 20)
			return R_MALFORMED;
		q->typ = T_SHORT;
		q->dcid_off = off + 1;
		q->dcid_len = cid_len;
		q->len = rem;
		return 0;
	}
	if (rem < 7)
		return R_MALFORMED;
	if (load(ctx, p + off, h, 7))
		return R_PASS;
	__u32 version = (__u32)h[1] << 24 | (__u32)h[2] << 16 | (__u32)h[3] << 8 | h[4];
	int known = version == 1 || version == 0x6b3343cf;
	__u32 dl = h[5];
	if (known && dl > 20)
		return R_MALFORMED;
	__u32 o = 6 + dl;
	if (rem < o + 1)
		return R_MALFORMED;
	q->dcid_off = off + 6;
	q->dcid_len = dl;
	__u8 sl;
	if (load(ctx, p + off + o, &sl, 1))
		return R_PASS;
	if (known && sl > 20)
		return R_MALFORMED;
	o += 1 + sl;
	if (rem < o)
		return R_MALFORMED;
	if (version == 0) {
		q->typ = T_VN;
		q->len = rem;
		return 0;
	}
	if (!known) {
		q->typ = T_UNKNOWN;
		q->len = rem;
		return 0;
	}
	__u32 bits = h[0] >> 4 & 3;
	__u32 typ;
	if (version == 1)
		typ = bits == 0 ? T_INITIAL : bits == 1 ? T_ZERORTT : bits == 2 ? T_HANDSHAKE : T_RETRY;
	else
		typ = bits == 0 ? T_RETRY : bits == 1 ? T_INITIAL : bits == 2 ? T_ZERORTT : T_HANDSHAKE;
	q->typ = typ;
	if (typ == T_RETRY) {
		// Retry is server-only: an error whether or not its tag fits.
		q->len = rem;
		return 0;
	}
	__u64 v;
	int k;
	if (typ == T_INITIAL) {
		k = varint(ctx, p, off + o, n, &v);
		if (k < 0)
			return R_PASS;
		if (k == 0)
			return R_MALFORMED;
		o += k;
		if (v > rem - o)
			return R_MALFORMED;
		o += (__u32)v;
	}
	k = varint(ctx, p, off + o, n, &v);
	if (k < 0)
		return R_PASS;
	if (k == 0)
		return R_MALFORMED;
	o += k;
	if (v > rem - o)
		return R_MALFORMED;
	if (v < 20)
		return R_MALFORMED;
	q->len = o + (__u32)v;
	return 0;
}

// all_zero reports 1 when the n-off bytes from payload offset off are zero,
// 0 when not, R_PASS when longer than it looks.
__noinline int all_zero(struct xdp_md *ctx, __u32 p, __u32 off, __u32 n)
{
	__u64 b[8];
	if (off > n || n > 0xffff)
		return R_PASS;
	for (int i = 0; i < MAX_PAYLOAD / 64; i++) {
		__u32 rem = n - off;
		if (rem == 0)
			return 1;
		__u32 k = rem < 64 ? rem : 64;
		__builtin_memset(b, 0, sizeof(b));
		if (load_var(ctx, p + off, b, BOUNDED(k, 63)))
			return R_PASS;
		if (b[0] | b[1] | b[2] | b[3] | b[4] | b[5] | b[6] | b[7])
			return 0;
		off += k;
	}
	return R_PASS;
}

// dcid_equal compares two DCIDs of the payload.
__noinline int dcid_equal(struct xdp_md *ctx, __u32 p, __u32 a, __u32 b, __u32 n)
{
	__u8 x[32], y[32];
	if (n == 0)
		return 1;
	if (n > 20)
		return R_PASS; // unknown versions only; never coalesced in practice
	if (load_var(ctx, p + a, x, BOUNDED(n, 31)) || load_var(ctx, p + b, y, BOUNDED(n, 31)))
		return R_PASS;
	for (int i = 0; i < 20; i++) {
		if (i >= n)
			break;
		if (x[i] != y[i])
			return 0;
	}
	return 1;
}

// classify_quic is quic.Classify with classifyQUIC's size rule for unknown
// versions.
__noinline int classify_quic(struct xdp_md *ctx, __u32 p, __u32 n, __u32 cid_len, struct cls *c)
{
	struct qpkt q = {.cid_len = cid_len};
	if (!c || cid_len > 20 || n > 0xffff)
		return R_PASS;
	int err = scan_quic(ctx, p, 0, n, &q);
	if (err)
		return err;
	__u32 typ = q.typ, kind;
	if (typ == T_SHORT || typ == T_HANDSHAKE)
		kind = KIND_ESTABLISHED;
	else if (typ == T_INITIAL || typ == T_ZERORTT || typ == T_UNKNOWN)
		kind = KIND_NEW;
	else
		return R_MALFORMED; // Retry, Version Negotiation: server-only
	__u32 dcid_off = q.dcid_off, dcid_len = q.dcid_len;
	int initial = typ == T_INITIAL;
	__u32 off = q.len;
	int done = 0;
	for (int i = 0; i < MAX_QUIC_PACKETS; i++) {
		if (off >= n) {
			done = 1;
			break;
		}
		int z = all_zero(ctx, p, off, n);
		if (z == R_PASS)
			return R_PASS;
		if (z) {
			done = 1;
			break;
		}
		err = scan_quic(ctx, p, off, n, &q);
		if (err)
			return err;
		if (q.dcid_len != dcid_len)
			return R_MALFORMED;
		int eq = dcid_equal(ctx, p, dcid_off, q.dcid_off, dcid_len);
		if (eq == R_PASS)
			return R_PASS;
		if (!eq)
			return R_MALFORMED;
		if (q.typ == T_RETRY || q.typ == T_VN)
			return R_MALFORMED;
		if (q.typ == T_INITIAL)
			initial = 1;
		if (q.len == 0)
			return R_PASS;
		off += q.len;
	}
	if (!done)
		return R_PASS;
	if (initial && n < 1200)
		return R_MALFORMED;
	if (typ == T_UNKNOWN && n < 1200)
		return R_MALFORMED;
	c->kind = kind;
	c->has_id = 1;
	c->id_off = dcid_off;
	c->id_len = dcid_len;
	return 0;
}

// ---- routing ----------------------------------------------------------------

// ordinal decodes the CID at payload offset off with the service's codec:
// 0..255, or -1 for "not routable" (QUIC-LB), or R_PASS.
__noinline int ordinal(struct xdp_md *ctx, __u32 p, __u32 off, __u32 len, struct svc_cfg *s)
{
	__u8 b[2];
	if (!s)
		return -2;
	if (s->codec == CODEC_ORDINAL_FIRST) {
		if (len != s->cid_len || len == 0)
			return 255;
		if (load(ctx, p + off, b, 1))
			return -2;
		return b[0];
	}
	// QUIC-LB plaintext: config rotation, server ID, nonce.
	if (len != s->cid_len || len < 2)
		return -1;
	if (load(ctx, p + off, b, 2))
		return -2;
	__u8 cr = b[0] >> 5;
	if (cr == 7 || cr != s->lb_config)
		return -1;
	if (s->lb_self && (b[0] & 0x1f) != len - 1)
		return -1;
	return b[1];
}

struct route {
	__u32 reason;
	__u32 ord;
};

// pick_addrs is hrw's PickAddrs(client, service) through the snapshot.
static __always_inline int pick_key(struct snap *sn, struct scratch *sc, __u32 n)
{
	if (sn->nready == 0)
		return -1;
	__u64 h = xxh64(sc->key, n, sn->seed);
	return sn->owner[(h >> (64 - BUCKET_BITS)) & (BUCKETS - 1)];
}

static __always_inline void put_addr(__u8 *dst, const struct addr *a)
{
	__builtin_memcpy(dst, a->ip, 16);
	dst[16] = a->port >> 8;
	dst[17] = a->port;
}

// ---- checksums ----------------------------------------------------------------

static __always_inline __u16 fold(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

// sum32 adds n bytes (a multiple of 4, a constant) at p as native 32-bit
// words: what csum_partial adds, without a helper call. The words are
// copied out bytewise (memcpy), which aliases anything: p is often a
// struct just built field by field.
static __always_inline __u64 sum32(const void *p, int n)
{
	__u64 s = 0;
#pragma unroll
	for (int i = 0; i < n / 4; i++) {
		__u32 w;
		__builtin_memcpy(&w, (const __u8 *)p + 4 * i, 4);
		s += w;
	}
	return s;
}

// sum32w is sum32 for packet data and map values, read a word at a time:
// the verifier takes any alignment there (the payload sum reads packet
// words at any offset too), never on the stack.
static __always_inline __u64 sum32w(const void *p, int n)
{
	__u64 s = 0;
#pragma unroll
	for (int i = 0; i < n / 4; i++)
		s += ((const __u32 *)p)[i];
	return s;
}

// copy32 copies n bytes (a multiple of 4, a constant) a word at a time
// between packet data and map values, as sum32w reads, or from the stack
// at a word-aligned place.
static __always_inline void copy32(void *dst, const void *src, int n)
{
#pragma unroll
	for (int i = 0; i < n / 4; i++)
		((__u32 *)dst)[i] = ((const __u32 *)src)[i];
}

// copy_mac copies a MAC address as copy32 does.
static __always_inline void copy_mac(void *dst, const void *src)
{
	*(__u32 *)dst = *(const __u32 *)src;
	*(__u16 *)(dst + 4) = *(const __u16 *)(src + 4);
}

// payload_sum is the 32-bit ones' complement partial sum of n bytes at data
// offset off, in memory order (csum_partial's), or -1 when out of bounds.
static __noinline __s64 payload_sum(struct xdp_md *ctx, __u32 off, __u32 n)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u64 s = 0;
	if (off > 127 || n > MAX_PAYLOAD + 511)
		return -1;
	asm volatile("" : "+r"(off));
	__u8 *q = data + (off & 127);
	__u32 left = n;
	for (int i = 0; i < MAX_PAYLOAD / 512; i++) {
		if (left < 512)
			break;
		if ((void *)(q + 512) > end)
			return -1;
		s = bpf_csum_diff(0, 0, (void *)q, 512, s);
		q += 512;
		left -= 512;
	}
	if (left >= 512)
		return -1;
	// The rest, under 512 bytes, 16 bytes to a bounds check, then words.
	for (int i = 0; i < 31; i++) {
		if (left < 16)
			break;
		asm volatile("" : "+r"(q));
		if ((void *)(q + 16) > end)
			return -1;
		s += (__u64)*(__u32 *)q + *(__u32 *)(q + 4) + *(__u32 *)(q + 8) + *(__u32 *)(q + 12);
		q += 16;
		left -= 16;
	}
	for (int i = 0; i < 3; i++) {
		if (left < 4)
			break;
		asm volatile("" : "+r"(q));
		if ((void *)(q + 4) > end)
			return -1;
		s += *(__u32 *)q;
		q += 4;
		left -= 4;
	}
	__u8 t[4] __attribute__((aligned(4))) = {};
	if (left > 0) {
		if ((void *)(q + 1) > end)
			return -1;
		t[0] = q[0];
	}
	if (left > 1) {
		if ((void *)(q + 2) > end)
			return -1;
		t[1] = q[1];
	}
	if (left > 2) {
		if ((void *)(q + 3) > end)
			return -1;
		t[2] = q[2];
	}
	s += sum32(t, 4);
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	return (__s64)(s & 0xffffffff);
}

// A pseudo header in network order: the larger (IPv6) form, with IPv4 using
// the first 12 bytes.
struct pseudo6 {
	__u8 src[16];
	__u8 dst[16];
	__be32 len;
	__u8 zero[3];
	__u8 nh;
};

struct pseudo4 {
	__u8 src[4];
	__u8 dst[4];
	__u8 zero;
	__u8 proto;
	__be16 len;
} __attribute__((aligned(4)));

// udp_sum completes a UDP checksum: the pseudo header for family (IPv4
// addresses are the last 4 bytes of the 16-byte forms), the UDP header with
// a zero checksum, the extra bytes (the PPv2 header) and the payload sum.
static __always_inline __u16 udp_sum(int v4, const __u8 *src, const __u8 *dst, __u16 sport, __u16 dport,
				     __u32 ulen, __u64 psum, void *extra, __u32 extra_len)
{
	__u64 s = psum;
	struct udphdr u = {.source = bpf_htons(sport), .dest = bpf_htons(dport), .len = bpf_htons(ulen), .check = 0};
	if (v4) {
		// The addresses are a map value's (struct out): their words.
		struct pseudo4 ph = {.zero = 0, .proto = IPPROTO_UDP, .len = bpf_htons(ulen)};
		s += sum32w(src + 12, 4) + sum32w(dst + 12, 4) + sum32(&ph.zero, 4);
	} else {
		struct pseudo6 ph = {.len = bpf_htonl(ulen), .nh = IPPROTO_UDP};
		s += sum32w(src, 16) + sum32w(dst, 16) + sum32(&ph.len, 8);
	}
	s += sum32(&u, sizeof(u));
	if (extra_len == 28)
		s += sum32w(extra, 28);
	else if (extra_len == 52)
		s += sum32w(extra, 52);
	__u16 c = ~fold(s);
	return c == 0 ? 0xffff : c;
}

static __always_inline __u16 ip4_sum(struct iphdr *ip)
{
	__u64 s = sum32w(ip, sizeof(*ip));
	return ~fold(s);
}

// ---- addresses ----------------------------------------------------------------

static const __u8 v4prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

// is4 reports whether ip, a 16-byte form at a word-aligned place (or in
// a map value), is IPv4 (::ffff:a.b.c.d).
static __always_inline int is4(const __u8 *ip)
{
	const __u32 *w = (const __u32 *)ip;
	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff);
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int unspecified(const __u8 *ip)
{
	__u64 hi = *(const __u64 *)ip, lo = *(const __u64 *)(ip + 8);
	return (hi == 0 && lo == 0) || (is4(ip) && ip[12] == 0 && ip[13] == 0 && ip[14] == 0 && ip[15] == 0);
}

// plain_unicast: what the kernel would take as a client's source (not
// unspecified, loopback, multicast, broadcast or 0.0.0.0/8, class E).
static __always_inline int plain_unicast(const __u8 *ip)
{
	if (is4(ip)) {
		__u8 a = ip[12];
		if (a == 0 || a == 127 || a >= 224)
			return 0;
		return 1;
	}
	if (ip[0] == 0xff)
		return 0;
	__u64 hi = *(const __u64 *)ip, lo = *(const __u64 *)(ip + 8);
	if (hi == 0 && (lo == 0 || lo == bpf_cpu_to_be64(1)))
		return 0;
	if (hi == 0) // other ::/96 forms (IPv4-compatible, NAT64 handled by stack)
		return 0;
	return 1;
}

// ---- FIB and transmit ------------------------------------------------------------

// The kernel answers FIB lookups only for an input interface with
// forwarding on, so they go in as from loopback (ifindex 1), where the
// loader turns it on: the route of a locally sent datagram, which is what
// the pipeline's sockets would get.
#define LOOKUP_IFINDEX 1

// fib finds the next hop towards dst and fills the source address (16-byte
// form) and MACs. 0 on success, R_PASS when the stack must handle it (no
// route, no neighbour entry yet, or larger than the egress MTU).
static __always_inline int fib(struct xdp_md *ctx, int v4, const __u8 *dst, __u16 sport, __u16 dport,
			       __u32 tot_len, __u8 *src, struct bpf_fib_lookup *f)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->ifindex = LOOKUP_IFINDEX;
	f->l4_protocol = IPPROTO_UDP;
	f->sport = bpf_htons(sport);
	f->dport = bpf_htons(dport);
	f->tot_len = tot_len;
	if (v4) {
		f->family = AF_INET;
		__builtin_memcpy(&f->ipv4_dst, dst + 12, 4);
	} else {
		f->family = AF_INET6;
		__builtin_memcpy(f->ipv6_dst, dst, 16);
	}
	long rc = bpf_fib_lookup(ctx, f, sizeof(*f), BPF_FIB_LOOKUP_SRC);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return R_PASS;
	if (v4) {
		__builtin_memcpy(src, v4prefix, 12);
		__builtin_memcpy(src + 12, &f->ipv4_src, 4);
	} else {
		__builtin_memcpy(src, f->ipv6_src, 16);
	}
	return 0;
}

// emit rewrites the frame so that it holds hl bytes of new headers (MACs,
// IP, UDP and the PPv2 header hdr of hdr_len bytes) in front of the
// payload, which stays where it is: the head moves by delta. It returns
// the XDP verdict.

static __noinline int emit(struct xdp_md *ctx, __u32 old_hl, __u32 hdr_len)
{
	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		return XDP_PASS;
	struct out *o = &sc->o;
	struct bpf_fib_lookup *f = (void *)sc->f;
	void *hdr = sc->hdr;
	int v4 = is4(o->dst);
	__u32 ip_hl = v4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	__u32 new_hl = sizeof(struct ethhdr) + ip_hl + sizeof(struct udphdr) + hdr_len;
	__u32 ulen = sizeof(struct udphdr) + hdr_len + o->plen;
	if (bpf_xdp_adjust_head(ctx, (int)old_hl - (int)new_hl))
		return XDP_PASS; // no headroom: the stack will do
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return XDP_ABORTED;
	copy_mac(eth->h_dest, f->dmac);
	copy_mac(eth->h_source, f->smac);
	struct udphdr *udp;
	if (v4) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return XDP_ABORTED;
		eth->h_proto = bpf_htons(ETH_P_IP);
		ip->version = 4;
		ip->ihl = 5;
		ip->tos = 0;
		ip->tot_len = bpf_htons(ip_hl + ulen);
		ip->id = 0;
		ip->frag_off = bpf_htons(0x4000); // DF, as Linux sends UDP
		ip->ttl = 64;
		ip->protocol = IPPROTO_UDP;
		ip->check = 0;
		copy32(&ip->saddr, o->src + 12, 4);
		copy32(&ip->daddr, o->dst + 12, 4);
		ip->check = ip4_sum(ip);
		udp = (void *)(ip + 1);
	} else {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return XDP_ABORTED;
		eth->h_proto = bpf_htons(ETH_P_IPV6);
		*(__be32 *)ip6 = bpf_htonl(0x60000000);
		ip6->payload_len = bpf_htons(ulen);
		ip6->nexthdr = IPPROTO_UDP;
		ip6->hop_limit = 64;
		copy32(&ip6->saddr, o->src, 16);
		copy32(&ip6->daddr, o->dst, 16);
		udp = (void *)(ip6 + 1);
	}
	if ((void *)(udp + 1) > end)
		return XDP_ABORTED;
	udp->source = bpf_htons(o->sport);
	udp->dest = bpf_htons(o->dport);
	udp->len = bpf_htons(ulen);
	udp->check = udp_sum(v4, o->src, o->dst, o->sport, o->dport, ulen, o->psum, hdr, hdr_len);
	if (hdr_len == 28) {
		__u8 *h = (void *)(udp + 1);
		if ((void *)(h + 28) > end)
			return XDP_ABORTED;
		copy32(h, hdr, 28);
	} else if (hdr_len == 52) {
		__u8 *h = (void *)(udp + 1);
		if ((void *)(h + 52) > end)
			return XDP_ABORTED;
		copy32(h, hdr, 52);
	}
	if (f->ifindex == ctx->ingress_ifindex)
		return XDP_TX;
	return bpf_redirect(f->ifindex, 0);
}

// ---- the frame --------------------------------------------------------------

struct frame {
	__u8 src[16], dst[16]; // 16-byte forms
	__u16 sport, dport;
	__u32 hl;   // Ethernet + IP + UDP header bytes
	__u32 plen; // UDP payload bytes
	int v4;
};

// parse reads Ethernet, IP and UDP: 0, or R_PASS for anything the stack
// must see (not UDP, options, extension headers, fragments, VLANs, bad
// lengths or checksums). The payload checksum is verified later, by who
// needs the payload.
static __always_inline int parse(struct xdp_md *ctx, struct frame *fr, __u16 *csum)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return R_PASS;
	struct udphdr *udp;
	__u32 ip_payload;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > end)
			return R_PASS;
		if (ip->version != 4 || ip->ihl != 5 || ip->protocol != IPPROTO_UDP)
			return R_PASS;
		if (ip->frag_off & bpf_htons(0x3fff)) // MF or an offset
			return R_PASS;
		if (ip4_sum(ip) != 0)
			return R_PASS;
		__u32 tot = bpf_ntohs(ip->tot_len);
		if (tot < sizeof(*ip) + sizeof(struct udphdr) || (void *)ip + tot > end)
			return R_PASS;
		ip_payload = tot - sizeof(*ip);
		__builtin_memcpy(fr->src, v4prefix, 12);
		__builtin_memcpy(fr->src + 12, &ip->saddr, 4);
		__builtin_memcpy(fr->dst, v4prefix, 12);
		__builtin_memcpy(fr->dst + 12, &ip->daddr, 4);
		fr->v4 = 1;
		udp = (void *)(ip + 1);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		if ((void *)(ip6 + 1) > end)
			return R_PASS;
		if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP)
			return R_PASS;
		ip_payload = bpf_ntohs(ip6->payload_len);
		if (ip_payload < sizeof(struct udphdr) || (void *)(ip6 + 1) + ip_payload > end)
			return R_PASS;
		__builtin_memcpy(fr->src, &ip6->saddr, 16);
		__builtin_memcpy(fr->dst, &ip6->daddr, 16);
		if (is4(fr->src) || is4(fr->dst))
			return R_PASS; // IPv4-mapped on the wire: the stack's to judge
		fr->v4 = 0;
		udp = (void *)(ip6 + 1);
	} else {
		return R_PASS;
	}
	if ((void *)(udp + 1) > end)
		return R_PASS;
	if (bpf_ntohs(udp->len) != ip_payload)
		return R_PASS;
	fr->sport = bpf_ntohs(udp->source);
	fr->dport = bpf_ntohs(udp->dest);
	fr->hl = (void *)(udp + 1) - data;
	fr->plen = ip_payload - sizeof(struct udphdr);
	*csum = udp->check;
	return 0;
}

// checked verifies the datagram's UDP checksum from the payload sum, as the
// stack would before a socket sees it: 0 when fine, R_PASS when not (the
// stack then drops it, as it would have without XDP).
static __noinline int checked(struct frame *fr, __u16 csum, __u64 psum)
{
	if (csum == 0)
		return fr->v4 ? 0 : R_PASS; // IPv4: no checksum; IPv6: the stack drops it
	__u64 s = psum;
	if (fr->v4) {
		struct pseudo4 ph = {.proto = IPPROTO_UDP, .len = bpf_htons(fr->plen + 8)};
		__builtin_memcpy(ph.src, fr->src + 12, 4);
		__builtin_memcpy(ph.dst, fr->dst + 12, 4);
		s += sum32(&ph, sizeof(ph));
	} else {
		struct pseudo6 ph = {.len = bpf_htonl(fr->plen + 8), .nh = IPPROTO_UDP};
		__builtin_memcpy(ph.src, fr->src, 16);
		__builtin_memcpy(ph.dst, fr->dst, 16);
		s += sum32(&ph, sizeof(ph));
	}
	struct udphdr u = {.source = bpf_htons(fr->sport), .dest = bpf_htons(fr->dport),
			   .len = bpf_htons(fr->plen + 8), .check = csum};
	s += sum32(&u, sizeof(u));
	return fold(s) == 0xffff ? 0 : R_PASS;
}

// trim drops Ethernet padding after the UDP datagram.
static __always_inline int trim(struct xdp_md *ctx, struct frame *fr)
{
	long extra = (long)(ctx->data_end - ctx->data) - (long)(fr->hl + fr->plen);
	if (extra > 0 && bpf_xdp_adjust_tail(ctx, -(int)extra))
		return R_PASS;
	return 0;
}

// rp_ok applies the kernel's reverse path filter to a client's source: the
// stack would drop what it rejects before any socket.
static __noinline int rp_ok(struct xdp_md *ctx, struct frame *fr)
{
	__u32 k = 0;
	struct config *cfg = bpf_map_lookup_elem(&settings, &k);
	if (!cfg || cfg->rp_filter == 0)
		return 1;
	if (!fr->v4)
		return 1; // IPv6 has no reverse path filter
	struct bpf_fib_lookup f = {};
	f.ifindex = LOOKUP_IFINDEX;
	f.l4_protocol = IPPROTO_UDP;
	f.family = AF_INET;
	__builtin_memcpy(&f.ipv4_dst, fr->src + 12, 4);
	long rc = bpf_fib_lookup(ctx, &f, sizeof(f), BPF_FIB_LOOKUP_SKIP_NEIGH);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	return cfg->rp_filter == 2 || f.ifindex == ctx->ingress_ifindex;
}

// ---- forward ------------------------------------------------------------------

// ppv2 writes a PROXY v2 DGRAM header for src → dst (16-byte forms at
// word-aligned places, ports in host order) into h, a map value; its
// length.
static __always_inline __u32 ppv2(__u8 *h, const __u8 *src, __u16 sport, const __u8 *dst, __u16 dport)
{
	static const __u8 sig[12] __attribute__((aligned(4))) = {'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};
	copy32(h, sig, 12);
	h[12] = 0x21;
	if (is4(src) && is4(dst)) {
		h[13] = 0x12;
		h[14] = 0;
		h[15] = 12;
		copy32(h + 16, src + 12, 4);
		copy32(h + 20, dst + 12, 4);
		*(__be16 *)(h + 24) = bpf_htons(sport);
		*(__be16 *)(h + 26) = bpf_htons(dport);
		return 28;
	}
	h[13] = 0x22;
	h[14] = 0;
	h[15] = 36;
	copy32(h + 16, src, 16);
	copy32(h + 32, dst, 16);
	*(__be16 *)(h + 48) = bpf_htons(sport);
	*(__be16 *)(h + 50) = bpf_htons(dport);
	return 52;
}

// decide is Router.decide: R_FORWARDED and the ordinal, a drop reason, or
// R_PASS.
static __noinline int decide(struct xdp_md *ctx, struct svc_cfg *s, struct snap *sn, struct cls *c,
			     struct frame *fr)
{
	__u32 *ord = &c->ord;
	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		return R_PASS;
	int o;
	int by_addrs = 0; // hash client || service instead of the ID
	if (c->kind == KIND_ESTABLISHED) {
		if (c->id_len != s->cid_len)
			return R_CID_LENGTH; // a QUIC Handshake DCID of another length
		o = ordinal(ctx, fr->hl, c->id_off, c->id_len, s);
		if (o == -2)
			return R_PASS;
		if (o >= 0) {
			struct backend *b = &sn->be[o & 0xff];
			if (!b->present)
				return R_UNKNOWN_ORDINAL;
			if (b->state == STATE_GONE)
				return R_NOT_SERVING;
			*ord = o;
			return R_FORWARDED;
		}
		if (!s->lb_hash)
			return R_UNROUTABLE;
		by_addrs = 1; // QUIC-LB unroutable: the draft's fallback, never stale
	} else {
		if (c->has_id && c->id_len == s->cid_len) {
			o = ordinal(ctx, fr->hl, c->id_off, c->id_len, s);
			if (o == -2)
				return R_PASS;
			if (o >= 0) {
				struct backend *b = &sn->be[o & 0xff];
				if (b->present && b->state != STATE_GONE) {
					*ord = o;
					return R_FORWARDED;
				}
			}
		}
		__u32 id = s->id;
		__u32 *st = bpf_map_lookup_elem(&stale, &id);
		if (st && *st)
			return R_STALE_REGISTRY;
		by_addrs = !c->has_id;
	}
	__u32 n;
	if (by_addrs) {
		struct addr client = {.port = fr->sport};
		__builtin_memcpy(client.ip, fr->src, 16);
		put_addr(sc->key, &client);
		put_addr(sc->key + 18, &s->pub);
		n = 36;
	} else {
		n = c->id_len & 0xff;
		if (n > 0 && load_var(ctx, fr->hl + c->id_off, sc->key, BOUNDED(n, 255)))
			return R_PASS;
	}
	o = pick_key(sn, sc, n);
	if (o < 0)
		return R_NO_READY_BACKEND;
	*ord = o & 0xff;
	return R_FORWARDED;
}

// fwd_send sends the datagram to the backend in the scratch's out: the
// PPv2 header, the next hop, the new headers.
static __noinline int fwd_send(struct xdp_md *ctx, struct frame *fr, struct svc_cfg *s)
{
	__u32 zero = 0;
	struct scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc || !fr || !s)
		return XDP_PASS;
	struct out *o = &sc->o;
	// PPv2: source = the client as measured, destination = the service
	// (the address the client sent to, when the service is a wildcard).
	__u32 hl = ppv2(sc->hdr, fr->src, fr->sport, s->measured ? fr->dst : s->pub.ip, s->pub.port);

	int v4 = is4(o->dst);
	__u32 ip_hl = v4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if (fib(ctx, v4, o->dst, o->sport, o->dport, ip_hl + 8 + hl + o->plen, o->src, (void *)sc->f))
		return XDP_PASS;
	if (trim(ctx, fr))
		return XDP_PASS;
	return emit(ctx, fr->hl, hl);
}

static __always_inline int is_local(const __u8 *ip)
{
	return bpf_map_lookup_elem(&locals, (void *)ip) != NULL;
}

// martian reports a frame the kernel would drop from the wire before any
// socket: a martian source or destination (ip_route_input_slow: loopback,
// multicast, limited broadcast, unspecified; ip6_rcv_core: loopback and
// multicast sources, a loopback destination), a source that is one of
// the host's addresses or in a local route (fib_validate_source, at any
// rp_filter), an unspecified destination (no local route: never
// delivered). The program hands these up rather than dropping them: the
// stack then drops and counts them exactly as on the socket path, and
// where it would take them (accept_local, route_localnet, an IPv6 source
// that is a host address, an interface where they are normal: lo) the
// pipeline decides. Never transmitted from here. The set is wider than
// the kernel's (0/8, class E, the subnets' broadcast addresses as
// sources): those are only another path, not another verdict.
static __noinline int martian(struct frame *fr)
{
	if (!plain_unicast(fr->src) || is_local(fr->src))
		return 1;
	struct net_key k = {.prefixlen = 128};
	__builtin_memcpy(k.ip, fr->src, 16);
	if (bpf_map_lookup_elem(&local_nets, &k))
		return 1;
	const __u8 *d = fr->dst;
	if (fr->v4)
		return d[12] == 127 || (d[12] == 0 && d[13] == 0 && d[14] == 0 && d[15] == 0);
	__u64 hi = *(const __u64 *)d, lo = *(const __u64 *)(d + 8);
	return hi == 0 && (lo == 0 || lo == bpf_cpu_to_be64(1));
}

// handshake_of_other_len reports whether a QUIC datagram the classifier
// rejected starts with a v1 or v2 Handshake packet whose DCID is not of the
// service's length: the pipeline may count it as cid_length rather than
// malformed (Router.mismatchedCID parses the whole header), so it decides.
static __always_inline int handshake_of_other_len(struct xdp_md *ctx, struct frame *fr, struct svc_cfg *s)
{
	__u8 h[6];
	if (fr->plen < 6 || load(ctx, fr->hl, h, 6) || !(h[0] & 0x80))
		return 0;
	__u32 v = (__u32)h[1] << 24 | (__u32)h[2] << 16 | (__u32)h[3] << 8 | h[4];
	__u8 t = (h[0] >> 4) & 3;
	int hs = (v == 1 && t == 2) || (v == 0x6b3343cf && t == 3);
	return hs && h[5] != s->cid_len;
}

static __noinline int forward(struct xdp_md *ctx, struct frame *fr, struct svc_cfg *s, __u16 csum)
{
	__u32 id = s->id;
	if (s->pass || fr->plen > s->max_dgram)
		goto pass;
	if (martian(fr) || !rp_ok(ctx, fr))
		goto pass;
	__s64 psum = payload_sum(ctx, fr->hl, fr->plen);
	if (psum < 0 || checked(fr, csum, psum))
		goto pass;

	struct cls c = {};
	int r;
	if (s->proto == PROTO_DTLS)
		r = classify_dtls(ctx, fr->hl, fr->plen, s->cid_len, &c);
	else
		r = classify_quic(ctx, fr->hl, fr->plen, s->cid_len, &c);
	if (r == R_PASS || (r && s->proto == PROTO_QUIC && handshake_of_other_len(ctx, fr, s)))
		goto pass;
	if (r) {
		count(id, DIR_FORWARD, R_MALFORMED);
		return XDP_DROP;
	}
	void *m = bpf_map_lookup_elem(&snaps, &id);
	if (!m)
		goto pass;
	__u32 zero = 0;
	struct snap *sn = bpf_map_lookup_elem(m, &zero);
	if (!sn)
		goto pass;
	r = decide(ctx, s, sn, &c, fr);
	__u32 ord = c.ord;
	if (r == R_PASS)
		goto pass;
	if (r != R_FORWARDED) {
		count(id, DIR_FORWARD, r);
		return XDP_DROP;
	}
	struct scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		goto pass;
	struct backend *b = &sn->be[ord & 0xff];
	if (b->own == OWN_PASS)
		goto pass;
	if (b->own) {
		count(id, DIR_FORWARD, R_OWN_ADDRESS);
		return XDP_DROP;
	}
	struct out *o = &sc->o;
	o->sport = s->up_port;
	o->dport = b->port;
	o->plen = fr->plen;
	o->psum = psum;
	__builtin_memcpy(o->dst, b->ip, 16);

	r = fwd_send(ctx, fr, s);
	if (r == XDP_PASS)
		goto pass;
	count(id, DIR_FORWARD, R_FORWARDED);
	return r;
pass:
	count(id, DIR_FORWARD, R_PASSED);
	return XDP_PASS;
}

// ---- reverse ------------------------------------------------------------------

static __always_inline __u32 addr_home(const __u8 *ip, __u16 port)
{
	__u64 hi = le64(ip), lo = le64(ip + 8);
	__u64 x = (lo ^ ((__u64)port << 48 | port)) + hi * 0xff51afd7ed558ccdULL;
	return (__u32)((x * 0x9e3779b97f4a7c15ULL) >> 54) & (ADDR_SLOTS - 1);
}

// is_backend is Snapshot.IsBackend: 1, 0, or R_PASS.
static __always_inline int is_backend(struct snap *sn, const __u8 *ip, __u16 port)
{
	if (sn->rev_pass)
		return R_PASS;
	__u32 h = addr_home(ip, port);
	for (int i = 0; i < ADDR_PROBES; i++) {
		__u8 o = sn->slots[(h + i) & (ADDR_SLOTS - 1)];
		if (o == 0xff)
			return 0;
		struct backend *b = &sn->be[o];
		if (b->port == port && addr_eq(b->ip, ip))
			return 1;
	}
	return R_PASS;
}

static __always_inline int mac_eq(const __u8 *a, const __u8 *b)
{
	int eq = 1;
	for (int i = 0; i < ETH_ALEN; i++)
		eq &= a[i] == b[i];
	return eq;
}

// valid_client is the client test of Router.Reverse (route.go's
// validClient) for a: 1 valid, 0 not, or R_PASS where the program cannot
// know the pipeline's own-address set (another address of this host).
static __always_inline int valid_client(struct svc_cfg *s, const __u8 *ip, __u16 port)
{
	if (port == 0)
		return 0;
	int v4 = is4(ip);
	__u32 a = (__u32)ip[12] << 24 | (__u32)ip[13] << 16 | (__u32)ip[14] << 8 | ip[15];
	__u64 hi = *(const __u64 *)ip, lo = *(const __u64 *)(ip + 8);
	if (v4 && (a == 0 || (a >> 28) == 14 || a == 0xffffffff))
		return 0;
	if (!v4 && ((hi == 0 && lo == 0) || ip[0] == 0xff))
		return 0;
	// The rule refuses a client of the other family than the public
	// address (BadDestination); a dual-stack wildcard socket could still
	// send there, so the program leaves the question to it.
	if (v4 != is4(s->pub.ip))
		return R_PASS;
	if (v4) {
		if ((a >> 24) == 127)
			return (s->pub.ip[12] == 127 && is4(s->pub.ip)) ? R_PASS : 0;
	} else {
		if (hi == 0 && lo == bpf_cpu_to_be64(1)) {
			__u64 phi = *(const __u64 *)s->pub.ip, plo = *(const __u64 *)(s->pub.ip + 8);
			return (phi == 0 && plo == bpf_cpu_to_be64(1)) ? R_PASS : 0;
		}
	}
	if (addr_eq(ip, s->pub.ip) || addr_eq(ip, s->listen.ip)) {
		if (port == s->pub.port || port == s->listen.port)
			return 0;
		__u16 p = port;
		__u32 *owner = bpf_map_lookup_elem(&upstreams, &p);
		if (owner && *owner == s->id)
			return 0;
		return R_PASS;
	}
	if (is_local(ip))
		return R_PASS;
	return 1;
}

static __noinline int reverse(struct xdp_md *ctx, struct frame *fr, __u32 id, __u16 csum)
{
	struct svc_cfg *s = bpf_map_lookup_elem(&service_by_id, &id);
	if (!s)
		return XDP_PASS;
	if (s->pass || !is_local(fr->dst) || martian(fr))
		goto pass;
	void *m = bpf_map_lookup_elem(&snaps, &id);
	if (!m)
		goto pass;
	__u32 zero = 0;
	struct snap *sn = bpf_map_lookup_elem(m, &zero);
	if (!sn)
		goto pass;
	__s64 psum = payload_sum(ctx, fr->hl, fr->plen);
	if (psum < 0 || checked(fr, csum, psum))
		goto pass;
	int r = is_backend(sn, fr->src, fr->sport);
	if (r == R_PASS)
		goto pass;
	if (!r) {
		count(id, DIR_REVERSE, R_UNTRUSTED_SENDER);
		return XDP_DROP;
	}
	// ppv2.Parse, as far as the reply rule needs it.
	struct scratch *sc = bpf_map_lookup_elem(&scratch, &zero);
	if (!sc)
		goto pass;
	__u8 *h = sc->b;
	static const __u8 sig[12] = {'\r', '\n', '\r', '\n', 0, '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};
	__u32 n = fr->plen;
	if (n < 16) {
		// Too short: a signature prefix is "truncated", anything else "no
		// signature"; both are bad headers.
		count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
		return XDP_DROP;
	}
	if (load(ctx, fr->hl, h, 16))
		goto pass;
	int sig_ok = 1;
	for (int i = 0; i < 12; i++)
		sig_ok &= h[i] == sig[i];
	if (!sig_ok || h[12] != 0x21) {
		// No signature, another version, LOCAL, or an unknown command.
		count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
		return XDP_DROP;
	}
	__u32 blk = (__u32)h[14] << 8 | h[15];
	__u32 al;
	if (h[13] == 0x12)
		al = 12;
	else if (h[13] == 0x22)
		al = 36;
	else {
		count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
		return XDP_DROP;
	}
	if (16 + blk > n || blk < al) {
		count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
		return XDP_DROP;
	}
	if (blk != al)
		goto pass; // TLVs (a CRC32C to verify): the pipeline's
	struct addr src = {}, dst = {};
	if (al == 12) {
		if (load(ctx, fr->hl + 16, h + 16, 12))
			goto pass;
		__builtin_memcpy(src.ip, v4prefix, 12);
		__builtin_memcpy(src.ip + 12, h + 16, 4);
		__builtin_memcpy(dst.ip, v4prefix, 12);
		__builtin_memcpy(dst.ip + 12, h + 20, 4);
		src.port = (__u16)h[24] << 8 | h[25];
		dst.port = (__u16)h[26] << 8 | h[27];
	} else {
		if (load(ctx, fr->hl + 16, h + 16, 36))
			goto pass;
		__builtin_memcpy(src.ip, h + 16, 16);
		__builtin_memcpy(dst.ip, h + 32, 16);
		src.port = (__u16)h[48] << 8 | h[49];
		dst.port = (__u16)h[50] << 8 | h[51];
	}
	// isServiceAddr
	if (s->measured) {
		if (src.port != s->pub.port || !plain_unicast(src.ip)) {
			// Unspecified and multicast are refused by the pipeline too;
			// the other odd forms go up to be decided there.
			__u64 hi = *(__u64 *)src.ip, lo = *(__u64 *)(src.ip + 8);
			int unspec = (hi == 0 && lo == 0) || (is4(src.ip) && *(__u32 *)(src.ip + 12) == 0);
			int mcast = src.ip[0] == 0xff || (is4(src.ip) && (src.ip[12] >> 4) == 14);
			if (src.port != s->pub.port || unspec || mcast) {
				count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
				return XDP_DROP;
			}
			goto pass;
		}
		if (!is_local(src.ip))
			goto pass; // the pipeline's send would fail
	} else if (src.port != s->pub.port || !addr_eq(src.ip, s->pub.ip)) {
		count(id, DIR_REVERSE, R_BAD_PROXY_HEADER);
		return XDP_DROP;
	}
	r = valid_client(s, dst.ip, dst.port);
	if (r == R_PASS)
		goto pass;
	if (!r) {
		count(id, DIR_REVERSE, R_BAD_DESTINATION);
		return XDP_DROP;
	}
	__u32 hl = 16 + al;
	if (n == hl) {
		// A header without payload: DTLS and QUIC send no empty
		// datagrams, and a 0-byte one would only probe the client.
		count(id, DIR_REVERSE, R_MALFORMED);
		return XDP_DROP;
	}
	if (!plain_unicast(dst.ip))
		goto pass;

	// The payload follows the header; it loses the header's share of the
	// sum (its offset is even, so the sums subtract).
	__u64 hsum = al == 12 ? sum32w(h, 28) : sum32w(h, 52);
	struct out *o = &sc->o;
	o->sport = s->listen.port; // the service socket's
	o->dport = dst.port;
	o->plen = n - hl;
	__builtin_memcpy(o->dst, dst.ip, 16);
	// psum - hsum in ones' complement: add the complement.
	o->psum = (__u64)psum + (__u64)(~fold(hsum) & 0xffff);

	int v4 = is4(o->dst);
	__u32 ip_hl = v4 ? sizeof(struct iphdr) : sizeof(struct ipv6hdr);
	if (fib(ctx, v4, o->dst, o->sport, o->dport, ip_hl + 8 + o->plen, o->src, (void *)sc->f))
		goto pass;
	// The source the pipeline's send would have: the address the client
	// used (measured), else the service socket's bound address, else the
	// route's choice (o->src from fib).
	if (s->measured)
		__builtin_memcpy(o->src, src.ip, 16);
	else if (!unspecified(s->listen.ip))
		__builtin_memcpy(o->src, s->listen.ip, 16);
	if (is4(o->src) != v4)
		goto pass; // a family the service socket cannot send to
	if (!plain_unicast(o->src))
		goto pass; // a loopback service: the kernel refuses to send off the host
	if (trim(ctx, fr))
		goto pass;
	r = emit(ctx, fr->hl + hl, 0);
	if (r == XDP_PASS)
		goto pass;
	count(id, DIR_REVERSE, R_FORWARDED);
	return r;
pass:
	count(id, DIR_REVERSE, R_PASSED);
	return XDP_PASS;
}

SEC("xdp")
int cidroute(struct xdp_md *ctx)
{
	struct frame fr = {};
	__u16 csum;
	if (parse(ctx, &fr, &csum))
		return XDP_PASS;
	__u32 ifindex = ctx->ingress_ifindex;
	struct mac *mac = bpf_map_lookup_elem(&macs, &ifindex);
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if (!mac || (void *)(eth + 1) > end || !mac_eq(eth->h_dest, mac->a))
		return XDP_PASS;
	struct svc_key k = {};
	__builtin_memcpy(k.a.ip, fr.dst, 16);
	k.a.port = fr.dport;
	struct svc_cfg *s = bpf_map_lookup_elem(&services, &k);
	if (!s) {
		// A wildcard service: any of this host's addresses on its port.
		__builtin_memset(k.a.ip, 0, 16);
		if (fr.v4) {
			k.a.ip[10] = 0xff;
			k.a.ip[11] = 0xff;
		}
		s = bpf_map_lookup_elem(&services, &k);
		if (s && !is_local(fr.dst)) {
			count(s->id, DIR_FORWARD, R_PASSED);
			return XDP_PASS;
		}
	}
	if (s)
		return forward(ctx, &fr, s, csum);
	__u16 p = fr.dport;
	__u32 *id = bpf_map_lookup_elem(&upstreams, &p);
	if (id)
		return reverse(ctx, &fr, *id, csum);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
