// Package hrw chooses a backend for a new session by weighted rendezvous
// (highest random weight) hashing, identically on every machine.
//
// A Table is built once per backend snapshot with New and then answers
// Pick(key) with one XXH64 of the key and one array lookup, whatever the
// number of backends. It is immutable and safe for concurrent use; Pick and
// PickAddrs do not allocate.
//
// # Algorithm
//
// Everything below is integer arithmetic, so amd64, arm64 and big-endian
// s390x give bit-identical results (testdata/golden.txt pins them).
// XXH64(b, s) is the 64-bit xxHash of the bytes b with seed s, as
// github.com/cespare/xxhash/v2's Digest computes it after ResetWithSeed(s)
// (the package hashes with its own one-shot copy, tested against it);
// be32(k) is k as 4 bytes big-endian.
//
// Keys. An address is 18 bytes: its 16-byte IPv6 form (IPv4 as IPv4-mapped
// ::ffff:a.b.c.d, zone dropped, the zero netip.Addr as 16 zero bytes), then
// the port big-endian (AppendAddr). PickAddrs hashes client || service, 36
// bytes.
//
// Buckets. A key's bucket is XXH64(key, seed) >> 50, the top BucketBits = 14
// bits; Pick returns the owner of that bucket. The owners are chosen by
// weighted rendezvous hashing over the candidates (a weight of 0 counts as
// 1), as follows. When a candidate has a Permille from 1 to 999, every
// weight w below is Weight·Permille (Weight·1000 for the others): the same
// owners as weights in those proportions, exactly.
//
// Streams. A candidate with ordinal o emits points k = 0, 1, 2, …:
//
//	h_k   = XXH64(be32(k) || o, seed)      (5 bytes)
//	b_k   = h_k >> 50                      (the bucket the point lands on)
//	e_k   = negLog(h_k << 14) >> 17        (≈ Exp(1) · 2^40, see below)
//	tau_k = e_0 + e_1 + … + e_k            (saturating at 2^64-1)
//
// The candidate's score for bucket j is tau_k / weight for the first k with
// b_k = j. The owner of j is the candidate with the least score, compared
// exactly as tau_a·w_b < tau_b·w_a in 128-bit arithmetic; ties go to the
// lower ordinal. Each stream is a Poisson process spread uniformly over the
// buckets, so its first arrival at a bucket is exponential and independent
// from bucket to bucket; dividing by the weight makes this the exponential
// race of weighted rendezvous hashing, and a candidate owns a share
// w/Σw of the buckets. A candidate's scores do not depend on the other
// candidates: removing one moves only its buckets, adding one moves only the
// buckets it now wins, and raising a weight moves buckets only to it.
//
// New merges the streams in order of score and stops once every bucket has
// an owner that no later point can beat, which takes about
// Buckets·(ln Buckets + 0.6) ≈ 170,000 points whatever the number of
// candidates. (Scoring every bucket against every candidate would cost
// Buckets × N hashes.)
//
// negLog(x) approximates -ln(x/2^64) in units of 2^-57. Let m = x|1, z the
// number of leading zero bits of m (0–63), d = 2^64 - (m<<z) (an integer in
// [1, 2^63]), i = ((d-1) >> 53) (0–1023) and f = ((d-1) >> 21) mod 2^32. With
// gTab from table.go (gTab[i] = round(2^32 · G(i/2048)), G(y) = -ln(1-y)/y,
// for i = 0…1024),
//
//	g      = gTab[i] + (((gTab[i+1] - gTab[i]) · f) >> 32)
//	negLog = z · 99893036290645747 + ((d · g) >> 39)
//
// with d·g the full 128-bit product and 99893036290645747 = round(ln 2 ·
// 2^57). This is -ln(2^-z · (1-y)) = z·ln 2 + y·G(y) for y = d/2^64, with a
// relative error below 1e-6 (TestNegLogAccuracy).
//
// Balance. With 16384 buckets, a candidate's share of keys is its share of
// buckets: within a fraction of a percentage point of w/Σw for a few
// candidates; with 254 equal candidates each owns about 64 buckets, so shares
// vary by about ±12 % (one standard deviation) around the mean.
package hrw
