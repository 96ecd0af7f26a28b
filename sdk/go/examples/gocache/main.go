// Command gocache is an elastic slab cache beside `memcolo agent` (sdk/go/cache), and
// the cache job of M3's Go-Cache benchmark (EuroSys'21 §7.1.1) in bench/m3 and of the
// elastic tenant of `memcolo bench colocation`.
//
// It preloads -preload of a key space of -keys values of -value-bytes, then serves
// -gets uniform random gets from -workers goroutines; a miss waits -miss-ms (the
// backend lookup of M3's benchmark) and puts the value. Its run time therefore falls
// with the cache's hit rate, i.e. with the memory it holds.
//
//   - static (-max-mib N > 0): the cache never maps more than N MiB of slabs (the
//     application's own cache-size setting, as without memcolo); no agent.
//   - elastic (-max-mib 0): the cache grows freely, registers with `memcolo agent`
//     and gives memory back in layers on signals: slabs first (1 %/4 %, LRU), then the
//     Go runtime (FreeOSMemory, SetMemoryLimit); the allow-rate gate (M3 §4.2)
//     throttles its growth after a high signal.
//
// Every -report-ms it prints one JSON line {"t_s", "useful_bytes", "mapped_bytes",
// "rss_bytes", "done_frac", ...}; at the end {"done": true, "elapsed_s", ...}.
//
//	sudo memcolo agent &
//	cd sdk/go && go run ./examples/gocache -keys 200000 -value-bytes 4096
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"time"

	memcolo "github.com/memcolo/memcolo/sdk/go"
	"github.com/memcolo/memcolo/sdk/go/cache"
)

func main() {
	keys := flag.Int("keys", 200000, "size of the key space")
	valueBytes := flag.Int("value-bytes", 4096, "bytes per value")
	preload := flag.Float64("preload", 0.85, "share of the key space loaded first (M3: 85 %)")
	gets := flag.Int("gets", 400000, "random gets to serve")
	workers := flag.Int("workers", 8, "goroutines serving gets")
	missMs := flag.Float64("miss-ms", 1, "backend lookup on a miss, ms (M3: 1 ms)")
	maxMib := flag.Int64("max-mib", 0, "static cache size in MiB; 0: elastic with memcolo")
	name := flag.String("name", "gocache", "name registered with the agent")
	reportMs := flag.Int("report-ms", 500, "progress line interval, ms")
	seed := flag.Int64("seed", 1, "random seed")
	flag.Parse()

	start := time.Now()
	cfg := cache.Config{MaxBytes: *maxMib << 20}
	c, err := cache.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	var client *memcolo.Client
	if *maxMib == 0 {
		expected := uint64(32 << 20)
		client, err = memcolo.NewClient(memcolo.Config{Name: *name, ExpectedReclaimBytes: &expected})
		if err != nil {
			log.Fatal(err)
		}
		c.Attach(client)      // upper layer: evict whole slabs
		client.AddGoRuntime() // lower layer: FreeOSMemory + SetMemoryLimit
		client.Start()
		defer client.Close()
	}

	var served atomic.Int64
	var phase atomic.Int32 // 0 preload, 1 gets
	out := json.NewEncoder(os.Stdout)
	var outMu sync.Mutex
	emit := func(v map[string]any) {
		outMu.Lock()
		defer outMu.Unlock()
		_ = out.Encode(v)
	}
	report := func() map[string]any {
		s := c.Stats()
		v := map[string]any{
			"t_s":          time.Since(start).Seconds(),
			"useful_bytes": int64(c.Len()) * int64(*valueBytes),
			"mapped_bytes": c.MappedBytes(),
			"rss_bytes":    memcolo.RSSBytes(),
			"done_frac":    float64(served.Load()) / float64(*gets),
			"phase":        phase.Load(),
			"hits":         s.Hits,
			"misses":       s.Misses,
			"throttled":    s.ThrottledAllocs,
		}
		if client != nil {
			v["allow_rate"] = client.Gate().AllowRate()
			v["notifications"] = client.Notifications()
			v["failed_notifications"] = client.FailedNotifications()
			v["registered"] = client.Registered()
		}
		return v
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Duration(*reportMs) * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				emit(report())
			case <-stop:
				return
			}
		}
	}()

	value := make([]byte, *valueBytes)
	for i := range value {
		value[i] = byte(i)
	}
	n := int(float64(*keys) * *preload)
	for i := 0; i < n; i++ {
		if err := c.Put(fmt.Sprint(i), value); err != nil {
			log.Fatal(err)
		}
	}
	phase.Store(1)
	preloadS := time.Since(start).Seconds()
	miss := time.Duration(*missMs * float64(time.Millisecond))
	var wg sync.WaitGroup
	per := *gets / *workers
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(*seed*1000 + int64(w)))
			for i := 0; i < per; i++ {
				k := fmt.Sprint(r.Intn(*keys))
				if _, ok := c.Get(k); !ok {
					time.Sleep(miss)
					if err := c.Put(k, value); err != nil {
						log.Fatal(err)
					}
				}
				served.Add(1)
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	final := report()
	final["done"] = true
	final["elapsed_s"] = time.Since(start).Seconds()
	final["preload_s"] = preloadS
	emit(final)
}
