// Command gocache runs an elastic slab cache beside `memcolo agent`, like the
// Go-Cache benchmark of M3 (§6): it preloads part of a key space, then serves
// uniform random gets; a miss waits 1 ms (a backend lookup) and puts the value.
// On low/high signals the cache evicts 1 %/4 % of its slabs, then the Go runtime
// returns memory to the OS and lowers its memory limit; the allow-rate gate
// throttles growth after a high signal.
//
//	sudo memcolo agent &
//	cd sdk/go && go run ./examples/gocache -keys 200000 -value-bytes 4096
package main

import (
	"flag"
	"fmt"
	"log"
	"math/rand"
	"time"

	memcolo "github.com/memcolo/memcolo/sdk/go"
	"github.com/memcolo/memcolo/sdk/go/cache"
)

func main() {
	keys := flag.Int("keys", 200000, "size of the key space")
	valueBytes := flag.Int("value-bytes", 4096, "bytes per value")
	preload := flag.Float64("preload", 0.85, "share of the key space loaded first")
	gets := flag.Int("gets", 2000000, "random gets to serve")
	flag.Parse()

	client, err := memcolo.NewClient(memcolo.Config{Name: "gocache"})
	if err != nil {
		log.Fatal(err)
	}
	c, err := cache.New(cache.Config{})
	if err != nil {
		log.Fatal(err)
	}
	c.Attach(client)      // upper layer: evict slabs
	client.AddGoRuntime() // lower layer: FreeOSMemory + SetMemoryLimit
	client.Start()
	defer client.Close()

	value := make([]byte, *valueBytes)
	for i := 0; i < int(float64(*keys)**preload); i++ {
		_ = c.Put(fmt.Sprint(i), value)
	}
	start := time.Now()
	for i := 0; i < *gets; i++ {
		k := fmt.Sprint(rand.Intn(*keys))
		if _, ok := c.Get(k); !ok {
			time.Sleep(time.Millisecond)
			_ = c.Put(k, value)
		}
		if i%100000 == 0 {
			s := c.Stats()
			log.Printf("gets %d, slabs %d (%d MiB), hits %d, misses %d, rss %d MiB, allow rate %.2f, registered %v",
				i, c.Slabs(), c.MappedBytes()>>20, s.Hits, s.Misses, memcolo.RSSBytes()>>20,
				client.Gate().AllowRate(), client.Registered())
		}
	}
	log.Printf("done in %v", time.Since(start))
}
