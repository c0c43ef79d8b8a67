package rrl

import (
	"syscall"
	"unsafe"
)

// adviseHugePages asks the kernel to back the whole 2 MiB pages within the n bytes
// at p with transparent huge pages. It is advice: failure changes nothing but speed.
func adviseHugePages(p unsafe.Pointer, n int) {
	const huge = 2 << 20
	skip := int((huge - uintptr(p)%huge) % huge) // to the first huge page boundary
	whole := (n - skip) / huge * huge
	if whole <= 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Add(p, skip)), whole)
	_ = syscall.Madvise(b, syscall.MADV_HUGEPAGE)
}
