package hugepage

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Advise asks the kernel for transparent huge pages behind the weights
// in b (the whole 2 MiB pages inside it), before they are first touched:
// decode streams every weight row once, and 4 KiB pages cost a TLB miss per
// row. Where the kernel says no, nothing changes.
func Advise(b []byte) {
	const huge = 2 << 20
	if len(b) < huge {
		return
	}
	base := uintptr(unsafe.Pointer(&b[0]))
	start := int((base+huge-1)&^(huge-1) - base)
	end := int((base+uintptr(len(b)))&^(huge-1) - base)
	if end <= start {
		return
	}
	if unix.Madvise(b[start:end], unix.MADV_HUGEPAGE) != nil {
		return
	}
	// Memory the Go heap had used before is already backed by small
	// pages, which MADV_HUGEPAGE leaves as they are until khugepaged
	// comes by: collapse it now (Linux 6.1 on; best effort).
	unix.Madvise(b[start:end], unix.MADV_COLLAPSE)
}
