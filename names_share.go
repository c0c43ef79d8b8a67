package rrl

import "slices"

// The name hierarchy's share of the capacity (docs/names.md): the Go model
// of what the controller will compute once per tick and the kernel program will
// apply per packet. Not yet wired: no controller computes it and no filter applies
// it.
//
// Given each zone's arrival rates of queries for known names (names the server has
// answered as existing, nameLearner) and for the others (random names, names under
// a wildcard), and the capacity C left after proven (cookie) queries, the share is
// two max-min fair water levels, one per tier:
//
//   - known tier: Lk is the level at which the zones' admitted known rates,
//     min(known_z, Lk), add up to C, or no limit when they add up to less;
//   - unknown tier: Lu is the same over the zones' unknown rates and what the
//     known tier left, C - sum min(known_z, Lk).
//
// So no zone's flood, of random names or of real ones, takes another zone's known
// names' share; within a zone, and across zones, known names are served before any
// unknown one; the unknown names share what is left, max-min fairly across zones
// too. While the server keeps up (the sum of all rates at most C) both levels are
// "no limit" and nothing changes.
//
// A query then passes with probability min(1, L/rate), L its tier's level and rate
// its (zone, tier) group's measured rate: the source lattice's rule (tripCount,
// arrivalRate), with one more level per tier in the settings.
//
// Why two tiers and not one level over each zone's total with known names first
// inside it: with zones A (0.6 C of known names) and B (0.1 C known, 3 C random), one
// level over the totals gives each zone 0.5 C, so B's random names get 0.4 C while
// A's real users lose a sixth of their answers: the attack on B costs A. With two
// tiers A gets 0.6 C, B's known names 0.1 C and its random names the last 0.3 C.
//
// Everything is fixed point and truncates, as the kernel will: the admitted rates
// add up to C less at most one 2^-32 per zone, never more.

// zoneRates are one zone's arrival rates, in queries per second.
type zoneRates struct {
	known, unknown fixed
}

// nameLevels are the two water levels; fixedMax is no limit.
type nameLevels struct {
	known, unknown fixed
}

// waterLevel returns the level L at which the sum over rates of min(rate, L) is
// capacity, or fixedMax when the rates add up to no more than capacity. scratch, if
// large enough, holds the sorted copy.
func waterLevel(rates []fixed, capacity fixed, scratch []fixed) fixed {
	var sum fixed
	for _, r := range rates {
		sum = sum.Add(r)
	}
	if sum <= capacity {
		return fixedMax
	}
	s := append(scratch[:0], rates...)
	slices.Sort(s)
	left := capacity
	for i, r := range s {
		n := uint64(len(s) - i)
		// The n rates from r up are all at least r: if they would take more than
		// what is left at r, the level is an equal share of it.
		if r.MulInt(n) >= left {
			return fixed(uint64(left) / n)
		}
		left -= r
	}
	return fixedMax // not reached: the rates add up to more than capacity
}

// shareNames returns the water levels for zones at capacity (see above).
func shareNames(zones []zoneRates, capacity fixed) nameLevels {
	rates := make([]fixed, len(zones))
	scratch := make([]fixed, len(zones))
	for i, z := range zones {
		rates[i] = z.known
	}
	var lv nameLevels
	lv.known = waterLevel(rates, capacity, scratch)
	if lv.known != fixedMax {
		// The known names take it all: what truncation left over (less than one
		// 2^-32 per zone) is not shared out, so that the unknown tier's level only
		// grows with the capacity.
		return lv
	}
	left := capacity
	for i, z := range zones {
		left = left.Sub(z.known)
		rates[i] = z.unknown
	}
	lv.unknown = waterLevel(rates, left, scratch)
	return lv
}

// admitted returns what the levels admit of z.
func (lv nameLevels) admitted(z zoneRates) zoneRates {
	return zoneRates{known: min(z.known, lv.known), unknown: min(z.unknown, lv.unknown)}
}
