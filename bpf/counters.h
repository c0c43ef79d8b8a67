// Per-CPU counters (filter_stats.go) and the live clock kept beside them.
#pragma once

#include "settings.h"

// Counters of packets limited by a level: one per (family, prefix length), then the
// port and total nodes, so that a level keeps its counter whatever node it uses.
#define NUM_LIMITED (33 + 129 + 2)

enum counter {
	COUNTER_SEEN,
	COUNTER_PASSED,
	COUNTER_DROP_UNFOLLOWED,  // headers the parser cannot follow to UDP (see parse)
	COUNTER_DROP_SHORT,
	COUNTER_DROP_RESPONSE,
	COUNTER_DROP_REFLECTION,
	COUNTER_EXEMPT,
	COUNTER_REPORT_ONLY,      // would have been dropped (any reason), passed in report-only mode
	COUNTER_ERROR,            // internal failure, passed
	COUNTER_LIMITED0,         // limited by a level: COUNTER_LIMITED0 + step.limited
	COUNTER_COOKIE_PASSED = COUNTER_LIMITED0 + NUM_LIMITED, // passed on a valid server cookie
	COUNTER_COOKIE_INVALID,   // a server cookie that does not verify: judged as without one
	COUNTER_SLIPPED,          // limited, and answered at XDP with a truncated response
	COUNTER_NAMES_KNOWN,      // the names judge classified the query's name known
	COUNTER_NAMES_UNKNOWN,    // it classified it unknown (counted in the zone sketch)
	COUNTER_NAMES_LIMITED,    // an unknown name it refused (report-only included)
	COUNTER_NAMES_UNKNOWN_PASSED, // an unknown name whose final verdict is pass
	COUNTER_MAX,
};

// Per CPU: the packet counters and the state of the live clock (clock_now), placed
// next to the two counters every packet increments, so that it costs no other line.
struct counters {
	__u64 clock_sync;         // jiffies when clock_offset was last taken
	__u64 clock_offset;       // coarse clock minus jiffies * tick_ns at clock_sync
	__u64 value[COUNTER_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct counters);
} rrl_counters SEC(".maps");

// count adds one to the counter which (a constant) in c, if c is not NULL. The
// increment is written in assembly with the counter's offset as an immediate: clang
// would otherwise merge the increments of different counters into one pointer
// addition whose operand differs by path, which the verifier refuses to a process
// without CAP_PERFMON (it masks each pointer addition against Spectre v1 with one
// limit per instruction).
#define count(c, which)                                                             \
	do {                                                                        \
		_Static_assert((which) < COUNTER_MAX, "no such counter");           \
		struct counters *c_ = (c);                                          \
		__u64 v_;                                                           \
		if (c_)                                                             \
			asm volatile("%[v] = *(u64 *)(%[p] + %[off])\n\t"            \
				     "%[v] += 1\n\t"                                   \
				     "*(u64 *)(%[p] + %[off]) = %[v]"                 \
				     : [v] "=&r"(v_)                                  \
				     : [p] "r"(c_),                                   \
				       [off] "i"(offsetof(struct counters, value) +   \
						 (which) * sizeof(__u64))             \
				     : "memory");                                     \
	} while (0)

// count_limited adds one to the limited counter i. A global function that looks the
// counters up itself: its index is a value the verifier cannot know, which for a
// process without CAP_PERFMON it can check only on its own (see node_count).
// (The verifier takes only global functions that return a scalar.)
__noinline int count_limited(__u64 i)
{
	__u32 zero = 0;
	struct counters *c = bpf_map_lookup_elem(&rrl_counters, &zero);
	if (c && i < NUM_LIMITED)
		c->value[COUNTER_LIMITED0 + i]++;
	return 0;
}

// CLOCK_RESYNC_TICKS is how often (in jiffies) clock_now takes its offset afresh.
#define CLOCK_RESYNC_TICKS 256

// clock_now is the live clock: CLOCK_MONOTONIC at tick resolution (1 to 10 ms), a
// fraction of a percent of the estimator's 289 ms time constant. Packets within one
// tick decay nothing between them, exactly as the model treats equal timestamps.
//
// It counts jiffies, which the kernel reads inline (a load, not a helper call), and
// turns them into the coarse monotonic clock (bpf_ktime_get_coarse_ns, Linux 5.11),
// the clock the Go side reads cells against, with an offset this CPU takes from that
// clock every CLOCK_RESYNC_TICKS. Both advance on the same tick, so the two readings
// differ by at most a tick. Without tick_ns or counters it reads the coarse clock.
static __always_inline __u64 clock_now(const struct settings *s, struct counters *c)
{
	__u64 tick = s ? s->tick_ns : 0;
	if (!tick || !c)
		return bpf_ktime_get_coarse_ns();
	__u64 j = bpf_jiffies64();
	// Unsigned: a CPU that never synced (clock_sync 0) resyncs, and so does one
	// whose clock_sync is ahead of j (a race between two runs on this CPU).
	if (j - c->clock_sync >= CLOCK_RESYNC_TICKS) {
		c->clock_offset = bpf_ktime_get_coarse_ns() - j * tick;
		c->clock_sync = j;
	}
	return j * tick + c->clock_offset;
}
