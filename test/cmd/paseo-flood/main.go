// Command paseo-flood is the acceptance proof's connection flood, run as a
// sandbox's program (or from a test namespace): it opens -n TCP
// connections to -addr at once, keeps every one that connected, prints
// one JSON line {"attempts":N,"connected":C} and holds them for -hold
// before it exits, so that a neighbour can be tried while the flood still
// holds its connections. It only talks to the address it is given.
package main

import (
	"encoding/json"
	"flag"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "", "host:port to flood")
	n := flag.Int("n", 64, "connections to open at once")
	timeout := flag.Duration("timeout", 3*time.Second, "how long one connection may take")
	hold := flag.Duration("hold", 5*time.Second, "how long to hold the connections after reporting")
	flag.Parse()
	if *addr == "" {
		os.Exit(2)
	}
	var connected atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var held []net.Conn
	for i := 0; i < *n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp4", *addr, *timeout)
			if err != nil {
				return
			}
			connected.Add(1)
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}()
	}
	wg.Wait()
	_ = json.NewEncoder(os.Stdout).Encode(map[string]int64{"attempts": int64(*n), "connected": connected.Load()})
	time.Sleep(*hold)
	for _, c := range held {
		c.Close()
	}
}
