// The Go runtime as the lowest reclamation layer (M3 §4.1, Table 1: "call Go").

package memcolo

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RSSBytes returns the resident set size of this process in bytes from
// /proc/self/statm, or 0 where procfs is unavailable.
func RSSBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

// GoRuntime returns memory to the OS with the Go runtime's own knobs:
// debug.FreeOSMemory (a forced GC that also returns free spans to the OS at once,
// the behaviour M3 added to Go §4.1), and debug.SetMemoryLimit, lowered on a high
// signal so that the GC keeps the heap small, and raised again along the allow rate
// of Gate until the limit the process started with is back.
type GoRuntime struct {
	// Gate paces the regrowth of the memory limit; nil: restore at once after
	// the next Low handler call.
	Gate *AllowRateGate
	// FloorBytes is the lowest memory limit ever set (default 64 MiB).
	FloorBytes int64

	mu        sync.Mutex
	origLimit int64
	shrunk    int64
	lastLimit int64
	regrowing bool
}

func (g *GoRuntime) floor() int64 {
	if g.FloorBytes > 0 {
		return g.FloorBytes
	}
	return 64 << 20
}

func goTotalBytes() int64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.Sys - ms.HeapReleased)
}

func freeOSMemory() uint64 {
	before := RSSBytes()
	debug.FreeOSMemory()
	after := RSSBytes()
	if after >= before {
		return 0
	}
	return before - after
}

// Low is a handler for "low": free unused memory to the OS (cheap).
func (g *GoRuntime) Low(Notification) (uint64, error) { return freeOSMemory(), nil }

// High is a handler for "high" and "top": lower the memory limit below what the
// runtime holds by the target (not under FloorBytes), collect, and return free
// memory to the OS; then let the limit grow back along the allow rate.
func (g *GoRuntime) High(n Notification) (uint64, error) {
	g.mu.Lock()
	if g.shrunk == 0 {
		g.origLimit = debug.SetMemoryLimit(-1)
	}
	held := goTotalBytes()
	limit := held - int64(min(n.TargetBytes, uint64(math.MaxInt64/2)))
	if limit < g.floor() {
		limit = g.floor()
	}
	g.shrunk = limit
	g.lastLimit = limit
	debug.SetMemoryLimit(limit)
	start := !g.regrowing
	g.regrowing = true
	g.mu.Unlock()
	freed := freeOSMemory()
	if start {
		go g.regrow()
	}
	return freed, nil
}

// MemoryLimitShrunk reports the limit set by the last High call (0: none active).
func (g *GoRuntime) MemoryLimitShrunk() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shrunk
}

// LastShrunkLimit reports the limit the last High call set (0: never).
func (g *GoRuntime) LastShrunkLimit() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastLimit
}

// regrow raises the memory limit from the shrunk value towards the original one
// in proportion to the allow rate, and restores the original once r reaches 1.
func (g *GoRuntime) regrow() {
	for {
		time.Sleep(100 * time.Millisecond)
		r := 1.0
		if g.Gate != nil {
			r = g.Gate.AllowRate()
		}
		g.mu.Lock()
		if r >= 1 {
			debug.SetMemoryLimit(g.origLimit)
			g.shrunk = 0
			g.regrowing = false
			g.mu.Unlock()
			return
		}
		span := float64(g.origLimit - g.shrunk)
		if g.origLimit == math.MaxInt64 {
			// No limit before: grow by up to 4x the shrunk limit, then lift it.
			span = float64(3 * g.shrunk)
		}
		debug.SetMemoryLimit(g.shrunk + int64(r*span))
		g.mu.Unlock()
	}
}
