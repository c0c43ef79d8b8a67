package loadgen

// The in-kernel flood generator and the XDP programs benchmarks compare against.
//go:generate go tool bpf2go -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" -type gen_config xdpgen xdpgen_bpf.c
