package cache

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	memcolo "github.com/memcolo/memcolo/sdk/go"
)

const slabBytes = 64 << 10

func fill(t *testing.T, c *Cache, n, size int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if err := c.Put(fmt.Sprint(i), bytes.Repeat([]byte{byte(i)}, size)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestPutGetOverwrite(t *testing.T) {
	c, _ := New(Config{SlabBytes: slabBytes})
	defer c.Close()
	c.Put("a", []byte("1"))
	c.Put("b", []byte("2"))
	c.Put("a", []byte("3"))
	if v, ok := c.Get("a"); !ok || string(v) != "3" {
		t.Fatalf("a = %q %v", v, ok)
	}
	if _, ok := c.Get("zz"); ok {
		t.Fatal("hit on a missing key")
	}
	c.Delete("b")
	if _, ok := c.Get("b"); ok {
		t.Fatal("deleted key found")
	}
	if err := c.Put("big", make([]byte, slabBytes+1)); err != ErrTooLarge {
		t.Fatalf("err %v", err)
	}
}

func TestEvictsOneAndFourPercentOfSlabsLRUFirst(t *testing.T) {
	c, _ := New(Config{SlabBytes: slabBytes})
	defer c.Close()
	fill(t, c, 200, slabBytes/2) // 2 items per slab -> 100 slabs
	if c.Slabs() != 100 {
		t.Fatalf("%d slabs", c.Slabs())
	}
	c.Get("0") // slab 0 becomes most recently used
	freed, _ := c.OnLow(memcolo.Notification{Level: "low"})
	if c.Slabs() != 99 || freed != slabBytes {
		t.Fatalf("low: %d slabs, %d freed", c.Slabs(), freed)
	}
	if _, ok := c.Get("0"); !ok {
		t.Fatal("the most recently used slab was evicted")
	}
	if _, ok := c.Get("2"); ok {
		t.Fatal("the least recently used slab survived")
	}
	freed, _ = c.OnHigh(memcolo.Notification{Level: "high"})
	if c.Slabs() != 95 || freed != 4*slabBytes { // ceil(99 * 4 %) = 4
		t.Fatalf("high: %d slabs, %d freed", c.Slabs(), freed)
	}
	if c.Len() != 190 {
		t.Fatalf("%d keys left", c.Len())
	}
}

func TestEvictedSlabsReturnToTheOS(t *testing.T) {
	c, _ := New(Config{})
	defer c.Close()
	fill(t, c, 256, 1<<20) // 256 MiB in 1 MiB slabs
	before := memcolo.RSSBytes()
	freed := c.EvictSlabs(50)
	after := memcolo.RSSBytes()
	if freed != 128<<20 {
		t.Fatalf("freed %d", freed)
	}
	if before < after || before-after < 100<<20 {
		t.Fatalf("RSS %d -> %d: slabs not returned to the OS", before, after)
	}
}

func TestMaxBytesBoundsTheCache(t *testing.T) {
	c, _ := New(Config{SlabBytes: slabBytes, MaxBytes: 10 * slabBytes})
	defer c.Close()
	fill(t, c, 100, slabBytes)
	if c.Slabs() != 10 || c.Stats().EvictedForMaxSize != 90 {
		t.Fatalf("%d slabs, stats %+v", c.Slabs(), c.Stats())
	}
}

func TestGateThrottlesGrowthWithoutFailingPuts(t *testing.T) {
	gate := memcolo.NewAllowRateGate(5)
	c, _ := New(Config{SlabBytes: slabBytes, Gate: gate})
	defer c.Close()
	fill(t, c, 20, slabBytes)
	gate.SignalReceived(time.Now()) // handling the first high signal: r = 0
	for i := 100; i < 150; i++ {
		if err := c.Put(fmt.Sprint(i), make([]byte, slabBytes)); err != nil {
			t.Fatal(err)
		}
	}
	if c.Slabs() != 20 || c.Stats().ThrottledAllocs != 50 {
		t.Fatalf("grew to %d slabs under r = 0 (stats %+v)", c.Slabs(), c.Stats())
	}
	if _, ok := c.Get("149"); !ok {
		t.Fatal("the newest put was lost")
	}
}

func TestBadConfig(t *testing.T) {
	if _, err := New(Config{SlabBytes: 1000}); err == nil {
		t.Fatal("accepted a slab that is not page-aligned")
	}
	if _, err := New(Config{MaxBytes: -1}); err == nil {
		t.Fatal("accepted negative MaxBytes")
	}
}
