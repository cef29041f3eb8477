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
// Owner of bucket j. Among the candidates with weight > 0, for each one
// compute h = XXH64(be32(j) || ordinal, seed) (5 bytes: the bucket index as 4
// bytes big-endian, then the ordinal byte) and L = negLog(h) below. The owner
// is the candidate with the smallest L/weight, compared exactly as
// L_a·w_b < L_b·w_a in 128-bit arithmetic; ties go to the lower ordinal.
// Since L approximates -ln(u) for a uniform u, L/w is exponentially
// distributed with rate w and each candidate wins a share weight/Σweight of
// the buckets; a candidate's scores do not depend on the others, so removing
// one moves only its buckets and adding one moves only the buckets it wins.
//
// negLog(h), in units of 2^-57: let m = h|1, z = the number of leading zero
// bits of m (0–63), d = 2^64 - (m<<z) as an integer in [1, 2^63], j = d>>53,
// f = (d>>21) mod 2^32. With G = gTab (table.go: gTab[j] = round(2^32 ·
// G(j/2048)) where G(y) = -ln(1-y)/y), g = gTab[j] + ((gTab[j+1]-gTab[j])·f
// >> 32) and the result is z·99893036290645747 + ((d·g) >> 39), where d·g is
// the full 128-bit product. (99893036290645747 = round(ln 2 · 2^57).)
//
// Bucket granularity is 1/8192 of the key space, so shares are accurate to
// well under a percentage point for a few backends; with 254 backends each
// owns about 32 buckets, i.e. its share varies by roughly ±18 % around the
// mean.
package hrw
