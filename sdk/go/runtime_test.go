package memcolo

import (
	"math"
	"runtime/debug"
	"testing"
	"time"
)

var sink [][]byte

func TestFreeOSMemoryReturnsGarbageToTheOS(t *testing.T) {
	for i := 0; i < 200; i++ {
		b := make([]byte, 1<<20)
		for j := range b {
			b[j] = 1
		}
		sink = append(sink, b)
	}
	sink = nil
	rt := &GoRuntime{}
	freed, err := rt.Low(Notification{Level: "low"})
	if err != nil || freed < 64<<20 {
		t.Fatalf("freed %d bytes (%v)", freed, err)
	}
}

func TestHighLowersTheMemoryLimitAndItGrowsBack(t *testing.T) {
	orig := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(orig)
	gate := NewAllowRateGate(1)
	rt := &GoRuntime{Gate: gate, FloorBytes: 1 << 20}
	now := time.Now()
	gate.SignalReceived(now)
	if _, err := rt.High(Notification{Level: "high", TargetBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	gate.SignalHandled(time.Now())
	if shrunk := rt.LastShrunkLimit(); shrunk <= 0 || shrunk >= orig || shrunk == math.MaxInt64 {
		t.Fatalf("limit not lowered: shrunk to %d from %d", shrunk, orig)
	}
	// The gate reaches 100 % after one epoch: the original limit comes back.
	deadline := time.Now().Add(wait)
	for debug.SetMemoryLimit(-1) != orig {
		if time.Now().After(deadline) {
			t.Fatalf("limit %d never restored to %d", debug.SetMemoryLimit(-1), orig)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if rt.MemoryLimitShrunk() != 0 {
		t.Fatal("still marked shrunk")
	}
}
