// Package hrw chooses a backend for a new session by weighted rendezvous
// (highest random weight) hashing, identically on every machine.
//
// A Table is built once per backend snapshot with New and then answers
// Pick(key) with one xxhash of the key and one array lookup, whatever the
// number of backends. It is immutable and safe for concurrent use; Pick and
// PickAddrs do not allocate.
//
// # Algorithm
//
// Everything below is integer arithmetic, so amd64, arm64 and big-endian
// s390x give bit-identical results. XXH64(b, s) is the 64-bit xxHash of the
// bytes b with seed s, as computed by xxhash.Digest.ResetWithSeed.
//
// Key serialization. An address is 18 bytes: the 16-byte IPv6 form (IPv4 as
// IPv4-mapped ::ffff:a.b.c.d, zone dropped, the zero address as zeros), then
// the port big-endian (AppendAddr). PickAddrs uses the key client || service
// (36 bytes).
//
// Buckets. A key's bucket is XXH64(key, seed) >> (64-BucketBits), i.e. the
// top 13 bits. The table stores one owner per bucket; Pick returns the owner
// of the key's bucket.
//
// Owner of bucket j. For each candidate with weight w > 0 compute
//
//	h = XXH64(be32(j) || ordinal, seed)   (5 bytes: the bucket index as 4
//	                                       bytes big-endian, the ordinal byte)
//	L = negLog(h)                          (≈ -ln u for a uniform u, below)
//	S = (L · floor((2^64-1)/w)) >> 64      (128-bit product; ≈ L/w)
//
// The owner is the candidate with the least S; ties go to the lower ordinal.
// L/w is exponentially distributed with rate w, so a candidate owns a share
// w/Σw of the buckets. A candidate's scores do not depend on the other
// candidates: removing one moves only its buckets, adding one moves only the
// buckets it now wins, and raising a weight only moves buckets to it.
//
// negLog(h), in units of 2^-57: let m = h|1, z = the number of leading zero
// bits of m (0–63), d = 2^64 - (m<<z) as an integer in [1, 2^63], i = d>>53
// and f = (d>>21) mod 2^32. With gTab from table.go (gTab[i] = round(2^32 ·
// G(i/2048)) where G(y) = -ln(1-y)/y), let g = gTab[i] + (((gTab[i+1] -
// gTab[i]) · f) >> 32); then negLog(h) = z·99893036290645747 + ((d·g) >>
// 39), with d·g the full 128-bit product and 99893036290645747 = round(ln 2
// · 2^57). This is -ln(2^-z · (1-y)) for y = d/2^64, computed as z·ln 2 +
// y·G(y) so that small y, where the winning scores lie, keeps its relative
// precision (about 1e-7).
//
// Bucket granularity is 1/8192 of the key space, so shares are accurate to
// well under a percentage point for a few backends; with 254 backends each
// owns about 32 buckets, i.e. its share varies by roughly ±18 % around the
// mean.
package hrw
