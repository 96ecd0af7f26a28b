// The client: registration, notification handling, reconnection.

package memcolo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// SocketEnv is the environment variable that overrides the socket path.
const SocketEnv = "MEMCOLO_SOCKET"

// Notification is one pressure notification.
type Notification struct {
	Seq         uint64 // echoed in the reclaimed answer
	Level       string // "low", "high" or "top"
	TargetBytes uint64 // about how much to give back
}

// Handler gives back memory for a notification and returns the bytes given back.
// An error (or a panic) is reported to the agent as a failed reclaim.
type Handler func(Notification) (uint64, error)

// Config configures a Client. Zero fields take the documented defaults.
type Config struct {
	SocketPath           string        // default $MEMCOLO_SOCKET, then DefaultSocket
	Class                string        // default "elastic"
	Name                 string        // optional
	ExpectedReclaimBytes *uint64       // optional (M3 §5.1, Algorithm 1)
	HandlerTimeout       time.Duration // default 10 s
	BackoffMin           time.Duration // default 100 ms
	BackoffMax           time.Duration // default 5 s
	Gate                 *AllowRateGate
	Logger               *slog.Logger // default slog.Default()
}

// Client is a registered elastic application's link to the agent. Create it with
// NewClient, add handlers with On, then Start. Handlers of one level run in the
// order they were added: the application's layer first, its runtime last (M3 §3-4).
type Client struct {
	cfg      Config
	handlers map[string][]Handler
	onReconn []func()

	stop       chan struct{}
	done       chan struct{}
	stopOnce   sync.Once
	mu         sync.Mutex
	conn       net.Conn
	busy       atomic.Bool
	registered atomic.Bool
	regs       atomic.Uint64
	notes      atomic.Uint64
	failed     atomic.Uint64
	warnMu     sync.Mutex
	warned     map[string]bool
}

// NewClient validates cfg and returns a client that is not started yet.
func NewClient(cfg Config) (*Client, error) {
	if cfg.SocketPath == "" {
		cfg.SocketPath = os.Getenv(SocketEnv)
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = DefaultSocket
	}
	if cfg.Class == "" {
		cfg.Class = "elastic"
	}
	if !contains(classes, cfg.Class) {
		return nil, fmt.Errorf("memcolo: unknown class %q (expected lc, be or elastic)", cfg.Class)
	}
	if cfg.HandlerTimeout <= 0 {
		cfg.HandlerTimeout = 10 * time.Second
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = 100 * time.Millisecond
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(5*time.Second, cfg.BackoffMin)
	}
	if cfg.Gate == nil {
		cfg.Gate = NewAllowRateGate(DefaultNumEpochs)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Client{
		cfg:      cfg,
		handlers: map[string][]Handler{},
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		warned:   map[string]bool{},
	}, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// On adds h as the next (lower) layer for level ("low", "high" or "top").
// Call it before Start.
func (c *Client) On(level string, h Handler) error {
	if !contains(levels, level) {
		return fmt.Errorf("memcolo: unknown level %q (expected low, high or top)", level)
	}
	c.handlers[level] = append(c.handlers[level], h)
	return nil
}

// OnReconnect adds a hook run after each re-registration following a lost connection.
func (c *Client) OnReconnect(f func()) { c.onReconn = append(c.onReconn, f) }

// AddGoRuntime adds the Go runtime (GoRuntime, paced by the client's gate) as the
// lowest layer of every level and returns it.
func (c *Client) AddGoRuntime() *GoRuntime {
	rt := &GoRuntime{Gate: c.cfg.Gate}
	_ = c.On("low", rt.Low)
	_ = c.On("high", rt.High)
	_ = c.On("top", rt.High)
	return rt
}

// Gate is the allow-rate gate fed by high and top notifications.
func (c *Client) Gate() *AllowRateGate { return c.cfg.Gate }

// Registered reports whether the agent acknowledged the current registration.
func (c *Client) Registered() bool { return c.registered.Load() }

// Registrations counts registrations (1 + reconnects).
func (c *Client) Registrations() uint64 { return c.regs.Load() }

// Notifications counts answered notifications.
func (c *Client) Notifications() uint64 { return c.notes.Load() }

// FailedNotifications counts notifications answered with ok=false.
func (c *Client) FailedNotifications() uint64 { return c.failed.Load() }

// Start runs the client in the background and returns at once. No agent is not an
// error: the client keeps retrying with backoff.
func (c *Client) Start() { go c.run() }

// Close stops the client and waits for its goroutine; the agent sees the
// connection close.
func (c *Client) Close() {
	c.stopOnce.Do(func() {
		close(c.stop)
		c.mu.Lock()
		if c.conn != nil {
			c.conn.Close()
		}
		c.mu.Unlock()
	})
	<-c.done
}

func (c *Client) warnOnce(kind, msg string, args ...any) {
	c.warnMu.Lock()
	seen := c.warned[kind]
	c.warned[kind] = true
	c.warnMu.Unlock()
	if !seen {
		c.cfg.Logger.Warn(msg+" (logged once)", args...)
	}
}

func (c *Client) stopping() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

func (c *Client) run() {
	defer close(c.done)
	backoff := c.cfg.BackoffMin
	reconnect := false
	for !c.stopping() {
		conn, err := net.Dial("unix", c.cfg.SocketPath)
		if err != nil {
			c.warnOnce("connect", "memcolo agent not reachable; retrying in the background", "socket", c.cfg.SocketPath, "err", err)
		} else {
			backoff = c.cfg.BackoffMin
			c.mu.Lock()
			c.conn = conn
			c.mu.Unlock()
			if c.stopping() {
				conn.Close()
				return
			}
			err := c.session(conn, reconnect)
			c.registered.Store(false)
			conn.Close()
			reconnect = true
			if c.stopping() {
				return
			}
			c.cfg.Logger.Info("connection to memcolo agent lost; reconnecting", "err", err)
		}
		select {
		case <-c.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, c.cfg.BackoffMax)
	}
}

func (c *Client) session(conn net.Conn, reconnect bool) error {
	reg := Register{Class: c.cfg.Class, ExpectedReclaimBytes: c.cfg.ExpectedReclaimBytes, Notify: "socket"}
	if c.cfg.Name != "" {
		name := c.cfg.Name
		reg.Name = &name
	}
	line, err := Encode(reg)
	if err != nil {
		return err
	}
	if _, err := conn.Write(line); err != nil {
		return err
	}
	r := bufio.NewReaderSize(conn, MaxLineBytes+2)
	var long []byte
	discarding := false
	for {
		chunk, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// A line over the limit: drop it up to its newline.
			if !discarding {
				c.warnOnce("too_long", "agent sent a line over the limit; discarded", "max_bytes", MaxLineBytes)
			}
			discarding = true
			long = nil
			continue
		}
		if err != nil {
			return err
		}
		if discarding {
			discarding = false
			continue
		}
		long = append(long[:0], chunk...)
		if herr := c.handleLine(conn, long, &reconnect); herr != nil {
			return herr
		}
	}
}

func (c *Client) handleLine(conn net.Conn, line []byte, reconnect *bool) error {
	msg, err := DecodeReply(bytes.TrimRight(line, "\n"))
	if err != nil {
		kind := "malformed"
		var pe *ProtocolError
		if errors.As(err, &pe) && pe.Code == CodeUnsupportedVersion {
			kind = "newer_version"
		}
		c.warnOnce(kind, "ignoring a message from the agent", "err", err)
		return nil
	}
	switch m := msg.(type) {
	case Registered:
		c.registered.Store(true)
		c.regs.Add(1)
		if *reconnect {
			*reconnect = false
			for _, f := range c.onReconn {
				func() {
					defer func() {
						if recover() != nil {
							c.warnOnce("reconnect_hook", "OnReconnect hook panicked")
						}
					}()
					f()
				}()
			}
		}
	case Notify:
		n := Notification{Seq: m.Seq, Level: m.Level, TargetBytes: m.TargetBytes}
		ok, freed, d := c.dispatch(n)
		c.notes.Add(1)
		if !ok {
			c.failed.Add(1)
		}
		seq := n.Seq
		out, err := Encode(Reclaimed{Seq: &seq, Bytes: freed, DurationMs: uint64(d.Milliseconds()), OK: ok})
		if err != nil {
			return err
		}
		_, err = conn.Write(out)
		return err
	case ErrorReply:
		c.cfg.Logger.Warn("agent answered with an error", "code", m.Code, "message", m.Message)
	}
	return nil
}

type outcome struct {
	ok    bool
	bytes uint64
	d     time.Duration
}

func (c *Client) runHandlers(n Notification) (res outcome) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			c.cfg.Logger.Warn("handler panicked", "level", n.Level, "panic", fmt.Sprint(p))
			res = outcome{false, 0, time.Since(start)}
		}
		c.busy.Store(false)
	}()
	var total uint64
	for _, h := range c.handlers[n.Level] {
		b, err := h(n)
		if err != nil {
			c.cfg.Logger.Warn("handler failed", "level", n.Level, "err", err)
			return outcome{false, 0, time.Since(start)}
		}
		total += b
	}
	return outcome{true, total, time.Since(start)}
}

func (c *Client) dispatch(n Notification) (bool, uint64, time.Duration) {
	received := time.Now()
	gated := n.Level == "high" || n.Level == "top"
	if gated {
		c.cfg.Gate.SignalReceived(received)
		defer func() { c.cfg.Gate.SignalHandled(time.Now()) }()
	}
	if !c.busy.CompareAndSwap(false, true) {
		c.warnOnce("busy", "a notification arrived while an overlong handler still runs; reported as failed")
		return false, 0, 0
	}
	res := make(chan outcome, 1)
	go func() { res <- c.runHandlers(n) }()
	select {
	case o := <-res:
		return o.ok, o.bytes, o.d
	case <-time.After(c.cfg.HandlerTimeout):
		c.cfg.Logger.Warn("handler ran past the timeout; reported as failed", "level", n.Level, "timeout", c.cfg.HandlerTimeout)
		return false, 0, time.Since(received)
	}
}
