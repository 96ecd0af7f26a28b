// Package cache is an elastic key-value cache in the manner of M3's Go-Cache
// (EuroSys'21 §4.1, §6): it grows freely, stores items in slabs of anonymous memory
// mapped outside the Go heap, and gives memory back in whole slabs, least recently
// used first: 1 % of its slabs on a low signal, 4 % on a high signal (M3 §6). An
// evicted slab is unmapped (munmap), so its memory really returns to the OS at once,
// without waiting for a garbage collection.
//
// With an allow-rate gate (M3 §4.2) the cache throttles its growth: while the gate
// does not admit an allocation, mapping a new slab first evicts the least recently
// used one, so the cache replaces data instead of growing. A put never fails for
// lack of memory.
package cache

import (
	"container/list"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"

	memcolo "github.com/memcolo/memcolo/sdk/go"
)

// DefaultSlabBytes is the slab size (1 MiB).
const DefaultSlabBytes = 1 << 20

// Eviction shares of M3's Go-Cache (§6), in percent of slabs.
const (
	LowEvictPercent  = 1.0
	HighEvictPercent = 4.0
)

// ErrTooLarge is returned by Put for a value larger than a slab.
var ErrTooLarge = errors.New("cache: value larger than a slab")

// Config configures a Cache.
type Config struct {
	// SlabBytes is the slab size in bytes, a multiple of the page size
	// (default DefaultSlabBytes).
	SlabBytes int
	// MaxBytes bounds the mapped slabs (a static size, as without memcolo);
	// 0: grow freely.
	MaxBytes int64
	// Gate throttles growth (M3 §4.2); nil: never throttled.
	Gate *memcolo.AllowRateGate
}

type slab struct {
	mem  []byte
	used int
	keys []string
	elem *list.Element
}

type entry struct {
	s   *slab
	off int
	n   int
}

// Cache is safe for concurrent use.
type Cache struct {
	cfg   Config
	mu    sync.Mutex
	lru   *list.List // of *slab, most recently used at the front
	index map[string]entry
	cur   *slab
	stats Stats
}

// Stats counts what the cache did.
type Stats struct {
	Hits, Misses      uint64
	SlabsMapped       uint64
	SlabsEvicted      uint64
	ThrottledAllocs   uint64 // new slabs that had to evict first (allow rate)
	EvictedForMaxSize uint64
}

// New returns an empty cache.
func New(cfg Config) (*Cache, error) {
	if cfg.SlabBytes == 0 {
		cfg.SlabBytes = DefaultSlabBytes
	}
	page := syscall.Getpagesize()
	if cfg.SlabBytes < page || cfg.SlabBytes%page != 0 {
		return nil, fmt.Errorf("cache: slab size %d is not a positive multiple of the %d-byte page", cfg.SlabBytes, page)
	}
	if cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("cache: negative MaxBytes %d", cfg.MaxBytes)
	}
	return &Cache{cfg: cfg, lru: list.New(), index: map[string]entry{}}, nil
}

// Put stores a copy of value under key. It returns ErrTooLarge for a value larger
// than a slab, and an error if the kernel refuses to map a slab.
func (c *Cache) Put(key string, value []byte) error {
	if len(value) > c.cfg.SlabBytes {
		return ErrTooLarge
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == nil || c.cur.used+len(value) > len(c.cur.mem) {
		if err := c.newSlab(); err != nil {
			return err
		}
	}
	s := c.cur
	copy(s.mem[s.used:], value)
	c.index[key] = entry{s: s, off: s.used, n: len(value)}
	s.keys = append(s.keys, key)
	s.used += len(value)
	c.lru.MoveToFront(s.elem)
	return nil
}

// newSlab maps a fresh slab, evicting first when the gate does not admit the
// allocation or when MaxBytes would be passed.
func (c *Cache) newSlab() error {
	if c.cfg.Gate != nil && !c.cfg.Gate.Admit() && c.lru.Len() > 0 {
		c.stats.ThrottledAllocs++
		c.evictLRU()
	}
	for c.cfg.MaxBytes > 0 && int64(c.lru.Len()+1)*int64(c.cfg.SlabBytes) > c.cfg.MaxBytes && c.lru.Len() > 0 {
		c.stats.EvictedForMaxSize++
		c.evictLRU()
	}
	mem, err := syscall.Mmap(-1, 0, c.cfg.SlabBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return fmt.Errorf("cache: mmap of a %d-byte slab: %w", c.cfg.SlabBytes, err)
	}
	s := &slab{mem: mem}
	s.elem = c.lru.PushFront(s)
	c.cur = s
	c.stats.SlabsMapped++
	return nil
}

// Get returns a copy of the value under key and marks its slab as recently used.
func (c *Cache) Get(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.index[key]
	if !ok {
		c.stats.Misses++
		return nil, false
	}
	c.stats.Hits++
	c.lru.MoveToFront(e.s.elem)
	out := make([]byte, e.n)
	copy(out, e.s.mem[e.off:e.off+e.n])
	return out, true
}

// Delete removes key (its space is freed with its slab).
func (c *Cache) Delete(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.index, key)
}

func (c *Cache) evictLRU() uint64 {
	back := c.lru.Back()
	if back == nil {
		return 0
	}
	s := back.Value.(*slab)
	c.lru.Remove(back)
	for _, k := range s.keys {
		if e, ok := c.index[k]; ok && e.s == s {
			delete(c.index, k)
		}
	}
	if c.cur == s {
		c.cur = nil
	}
	n := uint64(len(s.mem))
	_ = syscall.Munmap(s.mem) // returns the pages to the OS now
	s.mem, s.keys = nil, nil
	c.stats.SlabsEvicted++
	return n
}

// EvictSlabs evicts ⌈percent % of the slabs⌉ (at least one while any exist and
// percent > 0), least recently used first, and returns the bytes unmapped.
func (c *Cache) EvictSlabs(percent float64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if percent <= 0 || c.lru.Len() == 0 {
		return 0
	}
	n := int(math.Ceil(float64(c.lru.Len()) * math.Min(percent, 100) / 100))
	var freed uint64
	for i := 0; i < n; i++ {
		freed += c.evictLRU()
	}
	return freed
}

// OnLow is the handler for low signals: evict 1 % of the slabs (M3 §6).
func (c *Cache) OnLow(memcolo.Notification) (uint64, error) {
	return c.EvictSlabs(LowEvictPercent), nil
}

// OnHigh is the handler for high and top signals: evict 4 % of the slabs (M3 §6).
func (c *Cache) OnHigh(memcolo.Notification) (uint64, error) {
	return c.EvictSlabs(HighEvictPercent), nil
}

// Attach adds the cache as the upper layer of client (call AddGoRuntime after it
// for the layer below) and makes the client's gate throttle its growth.
func (c *Cache) Attach(client *memcolo.Client) {
	c.mu.Lock()
	c.cfg.Gate = client.Gate()
	c.mu.Unlock()
	_ = client.On("low", c.OnLow)
	_ = client.On("high", c.OnHigh)
	_ = client.On("top", c.OnHigh)
}

// Len is the number of keys.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

// Slabs is the number of mapped slabs.
func (c *Cache) Slabs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// MappedBytes is the memory mapped for slabs, in bytes.
func (c *Cache) MappedBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int64(c.lru.Len()) * int64(c.cfg.SlabBytes)
}

// Stats returns a copy of the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close unmaps every slab; the cache is empty and usable afterwards.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.lru.Len() > 0 {
		c.evictLRU()
	}
}
