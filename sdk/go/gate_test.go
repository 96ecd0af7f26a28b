package memcolo

import (
	"math"
	"testing"
	"time"
)

func TestGateFullRateWithoutSignals(t *testing.T) {
	g := NewAllowRateGate(5)
	for i := 0; i < 50; i++ {
		if !g.Admit() {
			t.Fatal("throttled without a signal")
		}
	}
}

func TestGateZeroWhileFirstSignalIsHandled(t *testing.T) {
	g := NewAllowRateGate(5)
	t0 := time.Unix(1000, 0)
	g.SignalReceived(t0)
	if r := g.AllowRateAt(t0.Add(3 * time.Second)); r != 0 {
		t.Fatalf("rate %v", r)
	}
}

func TestGateLinearGrowth(t *testing.T) {
	g := NewAllowRateGate(5)
	t0 := time.Unix(1000, 0)
	g.SignalReceived(t0)
	g.SignalHandled(t0.Add(2 * time.Second)) // window 10 s
	for _, c := range []struct {
		at   time.Duration
		want float64
	}{{time.Second, 0.1}, {5 * time.Second, 0.5}, {11 * time.Second, 1}} {
		if r := g.AllowRateAt(t0.Add(c.at)); math.Abs(r-c.want) > 1e-9 {
			t.Errorf("at %v: %v, want %v", c.at, r, c.want)
		}
	}
}

func TestGateFloorOneOverR(t *testing.T) {
	g := NewAllowRateGate(1)
	t0 := time.Unix(1000, 0)
	g.SignalReceived(t0)
	g.SignalHandled(t0.Add(10 * time.Second))
	now := t0.Add(2500 * time.Millisecond) // r = 0.25
	var got []bool
	for i := 0; i < 8; i++ {
		got = append(got, g.AdmitAt(now))
	}
	want := []bool{false, false, false, true, false, false, false, true}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("admitted %v, want %v", got, want)
		}
	}
}

func TestGateBeforeAllocEvictsAfterNewSignal(t *testing.T) {
	g := NewAllowRateGate(1)
	now := time.Now()
	g.SignalReceived(now.Add(-10 * time.Second))
	g.SignalHandled(now.Add(-9 * time.Second))
	if g.AllowRate() != 1 {
		t.Fatal("rate should be back to 1")
	}
	g.SignalReceived(now.Add(time.Hour))
	evicted := 0
	if !g.BeforeAlloc(func() { evicted++ }) || evicted != 1 {
		t.Fatal("no eviction right after a signal")
	}
}

func TestGateFastHandlerHeldToMinEpoch(t *testing.T) {
	// A handler done in 15 ms, NUM_epochs 5: without a floor r would be 100 % after
	// 75 ms; with the 1 s floor it climbs over 5 s.
	g := NewAllowRateGate(5)
	t0 := time.Unix(1000, 0)
	g.SignalReceived(t0)
	g.SignalHandled(t0.Add(15 * time.Millisecond))
	if e, ok := g.Epoch(); !ok || e != time.Second {
		t.Fatalf("epoch %v %v, want 1s", e, ok)
	}
	if r := g.AllowRateAt(t0.Add(time.Second)); math.Abs(r-0.2) > 1e-9 {
		t.Fatalf("rate after 1 s %v, want 0.2", r)
	}
	if r := g.AllowRateAt(t0.Add(5 * time.Second)); r != 1 {
		t.Fatalf("rate after 5 s %v, want 1", r)
	}
	// SetMinEpoch(0): the handling time alone.
	g.SetMinEpoch(0)
	g.SignalReceived(t0)
	g.SignalHandled(t0.Add(15 * time.Millisecond))
	if r := g.AllowRateAt(t0.Add(75 * time.Millisecond)); r != 1 {
		t.Fatalf("rate %v, want 1 without a floor", r)
	}
}
