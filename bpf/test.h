// Test-only maps: the clock and draw a test replays, so that it gives the kernel
// programs exactly what it gives the Go model. Never loaded by Attach or AttachXDP.
#pragma once

#include "common.h"

// test_input feeds rrl_filter_test its clock and draw, so a test can replay exactly
// what it gives the Go model.
struct test_input {
	__u64 now;
	__u32 rnd;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct test_input);
} rrl_test_input SEC(".maps");
