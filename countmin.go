package rrl

// Rate estimation: the per-cell estimator and the hashing shared, operation for
// operation, with bpf/sketch.h. This file is the specification of those functions;
// the C program must produce the same bits for the same inputs.
//
// Estimator. Each cell holds an exponentially decayed count of the packets that
// hashed to it and the time of its last update. On an arrival at time now the count
// is first decayed by 2^(-(now-last)/H), then incremented by one. H, the half-life,
// is 200 ms, so the decay's time constant is tau = H/ln 2 = 289 ms. For a steady rate
// r the count converges to r*tau (within 10% after 0.67 s, within 3% after one
// second), and after the source stops it halves every 200 ms (below 10% within
// 0.67 s). The rate estimate taken at an arrival is (count - 1/2) / tau: halfway
// between the count just before and just after the arrival, which removes the
// first-order sawtooth bias (a steady 10 pps flow reads as 10.1 pps, not 12.8).
// A fresh source's first packet reads as 1.7 pps and a burst of n packets as about
// 3.5*n pps, never as the reciprocal of a tiny inter-arrival time.
//
// The half-life trades noise for speed. One estimate's relative noise is about
// 1/sqrt(2*rate*tau), 13% at 100 pps, which softens the edge of a limit for sources
// close to it. A flood of k times the limit converges to the limit (admitting less
// than 10% over it) after tau*ln 11 = 0.69 s, whatever k, and the flooding source is
// estimated back under its limit H*log2(k) after it stops: 0.66 s at 10 times the
// limit, 1.3 s at 100 times.
//
// Time standing still or stepping backwards decays nothing and leaves the cell's
// time unchanged; the arrival is still counted.
//
// The decay factor 2^(-d/H) is computed without floating point or division: d/H
// comes from one multiplication by a fixed-point reciprocal (decayScale), its
// integer part k is a right shift, and its fraction is looked up in 1/64 steps in
// decayTable and linearly interpolated in between (relative error below 2e-5).

const (
	// halfLifeNanos is the estimator's half-life.
	halfLifeNanos = 200_000_000
	// decayFracBits: decayFactor computes dt/H with this many fraction bits.
	decayFracBits = 22
	// decayTableShift: decayTable has 1<<decayTableShift steps per half-life.
	decayTableShift = 6
	// decayInterpBits: the fraction bits left for interpolating between table steps.
	decayInterpBits = decayFracBits - decayTableShift
	// decayScale is round(2^(32+decayFracBits) / halfLifeNanos): (dt*decayScale)>>32
	// is dt/H with decayFracBits fraction bits (exact to 3e-9 relative).
	decayScale = 90071993
	// decayHorizon: after 32 half-lives every count below 2^32 has decayed to 0.
	decayHorizon = 32 * halfLifeNanos
	// rateScale is 1/tau in fixed: ln 2 / 0.2 s = 3.466 per second (×2^32).
	rateScale fixed = 14885222359
)

// decayTable[i] is 2^(-i/64) in fixed, rounded to nearest.
var decayTable = [1<<decayTableShift + 1]uint64{
	4294967296, 4248701965, 4202935003, 4157661043,
	4112874773, 4068570940, 4024744348, 3981389855,
	3938502376, 3896076880, 3854108391, 3812591987,
	3771522796, 3730896002, 3690706840, 3650950594,
	3611622603, 3572718252, 3534232978, 3496162267,
	3458501653, 3421246719, 3384393094, 3347936457,
	3311872529, 3276197082, 3240905930, 3205994934,
	3171459999, 3137297074, 3103502151, 3070071267,
	3037000500, 3004285971, 2971923842, 2939910317,
	2908241642, 2876914102, 2845924021, 2815267765,
	2784941738, 2754942382, 2725266179, 2695909648,
	2666869345, 2638141863, 2609723834, 2581611923,
	2553802834, 2526293303, 2499080105, 2472160047,
	2445529972, 2419186755, 2393127307, 2367348571,
	2341847524, 2316621173, 2291666561, 2266980759,
	2242560872, 2218404036, 2194507417, 2170868212,
	2147483648,
}

// decayFactor returns 2^(-dt/H) for dt nanoseconds, as a fixed in [0, 1].
func decayFactor(dt uint64) fixed {
	if dt >= decayHorizon {
		return 0
	}
	u := dt * decayScale >> 32 // dt/H, decayFracBits fraction bits; dt < 2^33, no overflow
	k := u >> decayFracBits
	f := u & (1<<decayFracBits - 1)
	i := f >> decayInterpBits
	r := f & (1<<decayInterpBits - 1)
	hi, lo := decayTable[i], decayTable[i+1]
	v := hi - ((hi-lo)*r)>>decayInterpBits
	return fixed(v >> k)
}

// cellArrive returns a cell's count and time after an arrival at now.
func cellArrive(count fixed, last, now uint64) (fixed, uint64) {
	if now > last {
		count = count.Mul(decayFactor(now - last))
		last = now
	}
	return count.Add(fixedOne), last
}

// arrivalRate is the rate estimate, in packets per second, of a cell whose count
// includes the arrival being judged.
func arrivalRate(count fixed) fixed {
	return count.Sub(fixedHalf).Mul(rateScale)
}

// tripCount returns the smallest count whose arrivalRate reaches limit (the
// largest fixed if none does). Below it a packet passes whatever its draw, since
// the draw is a fraction below 1: the Limiter and the kernel program compare with
// it first and multiply (the kernel program: take a random number) only at or
// above it, with the same verdicts.
func tripCount(limit fixed) fixed {
	lo, hi := fixed(0), ^fixed(0) // arrivalRate(hi) >= limit, or hi is the largest
	for lo < hi {
		mid := lo + (hi-lo)/2
		if arrivalRate(mid) >= limit {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// cellRate is the rate estimate of a cell read at now without an arrival (for
// reports such as the heaviest groups).
func cellRate(count fixed, last, now uint64) fixed {
	if now > last {
		count = count.Mul(decayFactor(now - last))
	}
	return count.Mul(rateScale)
}

// mix64 is the splitmix64 finaliser: a bijection with full avalanche.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// nameMul is an odd multiplier for hashing word by word (names, event keys): 2^64
// divided by the golden ratio.
const nameMul = 0x9e3779b97f4a7c15

// sketchHash hashes a node key, two 64-bit words: for a level node the masked
// source address (an IPv4 address is hi 0, lo the address), for the port node hi 0
// and lo the source port, for the total node 0 and 0. It is keyed by a per-limiter
// random seed so that an attacker cannot aim collisions at a victim's cells. Every
// node has sketches of its own, so the node need not be hashed; and with hi 0 the
// first round is the same for every key (mix64(seed), computed once), so an IPv4
// key costs one round.
func sketchHash(seed, hi, lo uint64) uint64 {
	return mix64(mix64(seed^hi) ^ lo)
}

// sketchIndex is the column of row in a sketch of width 1<<sketchWidthShift: each row
// takes its own 16 bits of the hash.
func sketchIndex(h uint64, row int) uint32 {
	return uint32(h>>(16*row)) & (sketchWidth - 1)
}

const (
	// sketchDepth is the number of rows of every CountMin sketch (countMin.arrive
	// writes the rows out).
	sketchDepth = 2
	// sketchWidthShift: every row has 1<<sketchWidthShift cells.
	sketchWidthShift = 11
	sketchWidth      = 1 << sketchWidthShift
	// cellBytes is the size of one cell: a fixed count and a uint64 time.
	cellBytes = 16
)

// Lattice nodes. The request limiter keeps one sketch per node:
//
//	nodes 0..4   IPv4 prefix levels, finest first (Config.requestLevels(true))
//	nodes 5..9   IPv6 prefix levels, finest first (Config.requestLevels(false))
//	node 10      all sources sharing one source port (/0 with the port), both families
//	node 11      all sources (/0 without a port): the total capacity
//
// A node that names a source port at a prefix level above /0 would have the same limit
// as that level's wildcard node and never a higher rate, so it could never be the
// tightest constraint: such nodes are not kept. Levels a Config does not use stay
// idle. The key of a level node is the source masked to the level's prefix with port
// 0; of the port node, address 0 and the port; of the total node, all zero.
const (
	// maxRequestLevel is the most prefix levels of one family, /0 aside (the
	// keywords ipv4-request-levels and ipv6-request-levels).
	maxRequestLevel = 5

	nodeIPv4First = 0
	nodeIPv6First = maxRequestLevel
	nodePort      = 2 * maxRequestLevel
	nodeTotal     = nodePort + 1
	numNodes      = nodeTotal + 1
	// sketchBytes is the memory of all sketches: 12 nodes * 2 rows * 2048 cells * 16 B.
	sketchBytes = numNodes * sketchDepth * sketchWidth * cellBytes
)

// countMin is a CountMin sketch of decaying counts, one per lattice node: sketchDepth
// rows of sketchWidth cells, cell (row, col) at index row*sketchWidth+col (the
// layout of the kernel program's per-node arrays), each cell a count and the time of
// its last update as cellArrive keeps them. A key is hashed once (sketchHash); row r
// uses column sketchIndex(h, r). An arrival updates one cell per row; a key's count
// is the smallest of its cells, because every other key that shares a cell can only
// add to it.
//
// Memory: sketchDepth*sketchWidth*cellBytes = 2*2048*16 B = 64 KiB, allocated with
// the Limiter and never grown.
//
// Accuracy. The decay is linear in the count (the decayed sum of the arrivals that
// hit a cell is the sum of their decayed counts, up to one truncation per update), so
// the classic CountMin bound holds for the decayed counts and therefore for the
// rates: with width w and depth d, a key's estimate is never below its own rate, and
// with probability at least 1-e^-d over the hash seed it exceeds it by at most
// (e/w) times the sum of the rates of all keys in the sketch. With w = 2048 and
// d = 2 that is 0.13% of the node's total traffic, with probability 86%; to exceed
// it, both rows must collide with heavy keys. A hostile sender cannot aim at a
// victim's cells without the per-Limiter seed. (countmin_test.go checks the bound
// against exact per-key counts at this size and at smaller widths and other depths.)
//
// Concurrency: safe for concurrent use without locks. An update is a load,
// cellArrive and a store per row (cmCell), so two racing arrivals on one cell can
// lose one of the two increments (an under-count of at most the number of racing
// CPUs), exactly as the kernel program's shared maps do. Nothing else can go wrong:
// a pair mixed from two racing updates (count of one, time of the other) holds
// times a few nanoseconds apart and only shifts one decay step by that much.
type countMin [sketchDepth][sketchWidth]cmCell

// arrive counts an arrival of the key with hash h at now and returns its count
// including the arrival: the minimum over the rows (feed it to arrivalRate). The two
// rows are written out so that their memory accesses overlap.
func (s *countMin) arrive(h, now uint64) fixed {
	c0 := &s[0][sketchIndex(h, 0)]
	c1 := &s[1][sketchIndex(h, 1)]
	count0, last0 := c0.load()
	count1, last1 := c1.load()
	// cellArrive twice, written out because the compiler does not inline it (checked
	// against cellArrive by TestCountMinMatchesReference).
	if now > last0 {
		count0 = count0.Mul(decayFactor(now - last0))
		last0 = now
	}
	if now > last1 {
		count1 = count1.Mul(decayFactor(now - last1))
		last1 = now
	}
	count0, count1 = count0.Add(fixedOne), count1.Add(fixedOne)
	c0.store(count0, last0)
	c1.store(count1, last1)
	return min(count0, count1)
}

// rate returns the estimated rate of the key with hash h at now, without counting an
// arrival: the minimum of cellRate over the rows.
func (s *countMin) rate(h, now uint64) fixed {
	least := fixedMax
	for row := range s {
		count, last := s[row][sketchIndex(h, row)].load()
		least = min(least, cellRate(count, last, now))
	}
	return least
}

// reset empties the sketch. Concurrent arrivals may survive it. It writes only the
// cells that hold something: an Update that resets a node no packet reached yet
// (or reached at a few cells) reads its memory instead of dirtying all of it, and
// under the race detector, where each cell is a pair of atomics, the first write to
// a cell costs far more than a read.
func (s *countMin) reset() {
	for row := range s {
		for col := range s[row] {
			if count, last := s[row][col].load(); count != 0 || last != 0 {
				s[row][col].store(0, 0)
			}
		}
	}
}
