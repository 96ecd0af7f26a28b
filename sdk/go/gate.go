// The adaptive allocation protocol of M3 §4.2.

package memcolo

import (
	"math"
	"sync"
	"time"
)

// DefaultNumEpochs is NUM_epochs as M3 set it for Go-Cache and Memcached (§4.2).
const DefaultNumEpochs = 5

// DefaultMinEpoch is the shortest epoch a gate uses: one poll of M3's monitor (§6)
// and of `memcolo agent` with its default poll_ms. M3 ends the epoch "when memory has
// been returned", and memory counts as returned for the node when the monitor sees
// it. A handler that returns in a few milliseconds (unmapping slabs) would otherwise
// reopen the gate before the next poll has even seen the node leave the red zone, and
// the application would regrow at once: in bench/m3 the Go cache's epochs of ~15 ms
// and the JVM job's of ~11 ms put r back at 100 % within one agent poll.
const DefaultMinEpoch = time.Second

// AllowRateGate implements M3's adaptive allocation protocol (§4.2): after a high
// signal only every ⌊1/r⌋-th allocation proceeds at once, the others first run the
// application's eviction callback (an allocation is never failed), with
//
//	r = min(time since the last high signal / (epoch × NUM_epochs), 1)
//	epoch = max(time the application took to handle that signal, minimum epoch)
//
// The minimum epoch is DefaultMinEpoch unless SetMinEpoch changes it.
//
// Until the first high signal has been handled there is no epoch and r = 0; a later
// signal drops r to 0 at its receipt and r climbs with the previous epoch until its
// handlers return. ⌊1/r⌋ is computed as ⌊window / elapsed⌋ in whole nanoseconds, so
// the gate takes the decisions of the other SDKs and of libmemcolo on the same clock
// readings (sdk/testvectors/gate.json).
// Safe for concurrent use; the zero value is not usable, use NewAllowRateGate.
type AllowRateGate struct {
	numEpochs  int
	minEpoch   time.Duration
	mu         sync.Mutex
	lastSignal time.Time
	epoch      time.Duration
	hasEpoch   bool
	count      uint64
}

// NewAllowRateGate returns a gate reaching 100 % after numEpochs epochs (min 1).
func NewAllowRateGate(numEpochs int) *AllowRateGate {
	if numEpochs < 1 {
		numEpochs = 1
	}
	return &AllowRateGate{numEpochs: numEpochs, minEpoch: DefaultMinEpoch}
}

// SetMinEpoch sets the shortest epoch (0: the handling time alone, M3 §4.2 to the
// letter; a negative d counts as 0). It applies from the next handled signal.
func (g *AllowRateGate) SetMinEpoch(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d < 0 {
		d = 0
	}
	g.minEpoch = d
}

// MinEpoch returns the shortest epoch the gate uses.
func (g *AllowRateGate) MinEpoch() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.minEpoch
}

// SignalReceived records a high signal received at t: the rate drops to 0.
func (g *AllowRateGate) SignalReceived(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lastSignal = t
	g.count = 0
}

// SignalHandled records that the handlers of the last signal finished at t.
func (g *AllowRateGate) SignalHandled(t time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lastSignal.IsZero() {
		return
	}
	g.epoch = t.Sub(g.lastSignal)
	if g.epoch < 0 {
		g.epoch = 0
	}
	if g.epoch < g.minEpoch {
		g.epoch = g.minEpoch
	}
	g.hasEpoch = true
}

// Epoch returns the epoch of the last handled signal (at least the minimum epoch)
// and whether there is one.
func (g *AllowRateGate) Epoch() (time.Duration, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.epoch, g.hasEpoch
}

// elapsedWindow returns the time since the last signal and the window (epoch ×
// NUM_epochs): (0, 0) without a signal (full rate), (0, 1) while the first signal has
// no epoch yet (rate 0). A window beyond the range of Duration saturates.
func (g *AllowRateGate) elapsedWindow(now time.Time) (time.Duration, time.Duration) {
	if g.lastSignal.IsZero() {
		return 0, 0
	}
	if !g.hasEpoch {
		return 0, 1
	}
	window := g.epoch * time.Duration(g.numEpochs)
	if g.epoch != 0 && window/g.epoch != time.Duration(g.numEpochs) {
		window = math.MaxInt64
	}
	elapsed := now.Sub(g.lastSignal)
	if elapsed < 0 {
		elapsed = 0
	}
	return elapsed, window
}

func (g *AllowRateGate) rate(now time.Time) float64 {
	elapsed, window := g.elapsedWindow(now)
	if elapsed >= window {
		return 1
	}
	return float64(elapsed) / float64(window)
}

// AllowRateAt returns r in [0, 1] at now.
func (g *AllowRateGate) AllowRateAt(now time.Time) float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rate(now)
}

// AllowRate returns r in [0, 1] now.
func (g *AllowRateGate) AllowRate() float64 { return g.AllowRateAt(time.Now()) }

// AdmitAt reports whether an allocation at now may proceed at once (true) or must
// evict first (false). r is recomputed on every call.
func (g *AllowRateGate) AdmitAt(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	elapsed, window := g.elapsedWindow(now)
	if elapsed >= window {
		g.count = 0
		return true
	}
	g.count++
	if elapsed == 0 {
		return false
	}
	if g.count >= uint64(window/elapsed) {
		g.count = 0
		return true
	}
	return false
}

// Admit is AdmitAt(time.Now()).
func (g *AllowRateGate) Admit() bool { return g.AdmitAt(time.Now()) }

// BeforeAlloc runs evict unless this allocation is admitted; it reports whether
// eviction ran. Call it in the allocation path.
func (g *AllowRateGate) BeforeAlloc(evict func()) bool {
	if g.Admit() {
		return false
	}
	evict()
	return true
}
