package memcolo

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// wait is a generous bound; no test asserts on how long anything took.
const wait = 20 * time.Second

type fakeAgent struct {
	t    *testing.T
	path string
	ln   net.Listener
	conn net.Conn
	r    *bufio.Reader
}

func newFakeAgent(t *testing.T, path string) *fakeAgent {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeAgent{t: t, path: path, ln: ln}
}

func (a *fakeAgent) accept() *fakeAgent {
	a.ln.(*net.UnixListener).SetDeadline(time.Now().Add(wait))
	c, err := a.ln.Accept()
	if err != nil {
		a.t.Fatal("no client connected: ", err)
	}
	c.SetDeadline(time.Now().Add(wait))
	a.conn, a.r = c, bufio.NewReader(c)
	return a
}

func (a *fakeAgent) recv() Message {
	line, err := a.r.ReadBytes('\n')
	if err != nil {
		a.t.Fatal("client line: ", err)
	}
	m, err := DecodeRequest(line)
	if err != nil {
		a.t.Fatalf("client sent %q: %v", line, err)
	}
	return m
}

func (a *fakeAgent) sendRaw(s string) {
	if _, err := io.WriteString(a.conn, s); err != nil {
		a.t.Fatal(err)
	}
}

func (a *fakeAgent) send(m Message) {
	b, err := Encode(m)
	if err != nil {
		a.t.Fatal(err)
	}
	a.sendRaw(string(b))
}

func (a *fakeAgent) handshake() Register {
	m := a.recv()
	reg, ok := m.(Register)
	if !ok || reg.Notify != "socket" || reg.PID != nil {
		a.t.Fatalf("expected a self registration, got %#v", m)
	}
	a.send(Registered{PID: int32(os.Getpid()), Class: reg.Class})
	return reg
}

func (a *fakeAgent) notify(seq uint64, level string, target uint64) Reclaimed {
	a.send(Notify{Seq: seq, Level: level, TargetBytes: target})
	m := a.recv()
	r, ok := m.(Reclaimed)
	if !ok || r.Seq == nil || *r.Seq != seq {
		a.t.Fatalf("expected reclaimed for seq %d, got %#v", seq, m)
	}
	a.send(OK{})
	return r
}

func (a *fakeAgent) close() {
	if a.conn != nil {
		a.conn.Close()
	}
	a.ln.Close()
	os.Remove(a.path)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for ", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func sockPath(t *testing.T) string { return filepath.Join(t.TempDir(), "agent.sock") }

func TestRegisterAndLayeredHandlers(t *testing.T) {
	path := sockPath(t)
	agent := newFakeAgent(t, path)
	defer agent.close()
	exp := uint64(1 << 20)
	c, err := NewClient(Config{SocketPath: path, Name: "cache", ExpectedReclaimBytes: &exp})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	c.On("high", func(n Notification) (uint64, error) { order = append(order, "app"); return n.TargetBytes / 2, nil })
	c.On("high", func(n Notification) (uint64, error) { order = append(order, "runtime"); return 100, nil })
	c.On("low", func(n Notification) (uint64, error) { return n.TargetBytes, nil })
	c.Start()
	defer c.Close()
	reg := agent.accept().handshake()
	if reg.Class != "elastic" || reg.Name == nil || *reg.Name != "cache" || *reg.ExpectedReclaimBytes != exp {
		t.Fatalf("registration %#v", reg)
	}
	waitFor(t, "registration", c.Registered)
	if r := agent.notify(7, "high", 4096); !r.OK || r.Bytes != 2148 {
		t.Fatalf("%#v", r)
	}
	if strings.Join(order, ",") != "app,runtime" {
		t.Fatalf("layers ran as %v", order)
	}
	if r := agent.notify(8, "low", 10); !r.OK || r.Bytes != 10 {
		t.Fatalf("%#v", r)
	}
	if r := agent.notify(9, "top", 10); !r.OK || r.Bytes != 0 {
		t.Fatalf("%#v", r)
	}
	if _, ok := c.Gate().Epoch(); !ok {
		t.Fatal("high signal did not feed the gate")
	}
}

func TestFailingPanickingAndOverlongHandlers(t *testing.T) {
	path := sockPath(t)
	agent := newFakeAgent(t, path)
	defer agent.close()
	c, _ := NewClient(Config{SocketPath: path, HandlerTimeout: 300 * time.Millisecond})
	release := make(chan struct{})
	c.On("low", func(Notification) (uint64, error) { return 0, errors.New("cache locked") })
	c.On("high", func(Notification) (uint64, error) { panic("handler bug") })
	c.On("top", func(Notification) (uint64, error) { <-release; return 5, nil })
	c.Start()
	defer c.Close()
	agent.accept().handshake()
	if r := agent.notify(1, "low", 1); r.OK {
		t.Fatal("error not reported")
	}
	if r := agent.notify(2, "high", 1); r.OK {
		t.Fatal("panic not reported")
	}
	if r := agent.notify(3, "top", 1); r.OK {
		t.Fatal("overlong handler not reported")
	}
	if r := agent.notify(4, "top", 1); r.OK {
		t.Fatal("notification during an overlong handler not refused")
	}
	close(release)
	waitFor(t, "slow handler", func() bool { return !c.busy.Load() })
	if r := agent.notify(5, "top", 1); !r.OK || r.Bytes != 5 {
		t.Fatalf("%#v", r)
	}
	if c.FailedNotifications() != 4 {
		t.Fatalf("failed %d", c.FailedNotifications())
	}
}

func TestReconnectsWhenTheAgentRestarts(t *testing.T) {
	path := sockPath(t)
	agent := newFakeAgent(t, path)
	c, _ := NewClient(Config{SocketPath: path, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	var hooks atomic.Int32
	c.OnReconnect(func() { hooks.Add(1) })
	c.On("low", func(Notification) (uint64, error) { return 1, nil })
	c.Start()
	defer c.Close()
	agent.accept().handshake()
	waitFor(t, "registration", func() bool { return c.Registrations() == 1 })
	agent.close()
	waitFor(t, "disconnect", func() bool { return !c.Registered() })
	time.Sleep(300 * time.Millisecond)
	agent = newFakeAgent(t, path)
	defer agent.close()
	agent.accept().handshake()
	waitFor(t, "re-registration", func() bool { return c.Registrations() == 2 })
	waitFor(t, "reconnect hook", func() bool { return hooks.Load() == 1 })
	if r := agent.notify(11, "low", 1); !r.OK || r.Bytes != 1 {
		t.Fatalf("%#v", r)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestBadLinesAreLoggedOnceAndIgnored(t *testing.T) {
	path := sockPath(t)
	agent := newFakeAgent(t, path)
	defer agent.close()
	var logs syncBuffer
	c, _ := NewClient(Config{SocketPath: path, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c.On("low", func(n Notification) (uint64, error) { return n.TargetBytes, nil })
	c.Start()
	defer c.Close()
	agent.accept().handshake()
	agent.sendRaw("garbage\n")
	agent.sendRaw("more garbage\n")
	agent.sendRaw(`{"v":1,"type":"hologram"}` + "\n")
	agent.sendRaw(`{"v":2,"type":"notify","seq":1,"level":"low","target_bytes":1}` + "\n")
	agent.sendRaw(`{"v":1,"type":"notify","seq":1,"le` + "\n")
	agent.sendRaw(strings.Repeat("x", 200000) + "\n")
	agent.send(ErrorReply{Code: CodeInternal, Message: "x"})
	if r := agent.notify(2, "low", 42); !r.OK || r.Bytes != 42 {
		t.Fatalf("%#v", r)
	}
	if c.Registrations() != 1 || c.Notifications() != 1 {
		t.Fatalf("registrations %d notifications %d", c.Registrations(), c.Notifications())
	}
	if n := strings.Count(logs.String(), "ignoring a message"); n != 2 {
		t.Fatalf("logged %d times:\n%s", n, logs.String())
	}
}

func TestNoAgentIsNotAnError(t *testing.T) {
	c, err := NewClient(Config{SocketPath: sockPath(t), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	c.Start()
	time.Sleep(200 * time.Millisecond)
	if c.Registered() || c.Gate().AllowRate() != 1 {
		t.Fatal("registered without an agent")
	}
	c.Close()
}

func TestBadConfiguration(t *testing.T) {
	if _, err := NewClient(Config{Class: "vip"}); err == nil {
		t.Fatal("accepted class vip")
	}
	c, _ := NewClient(Config{})
	if c.On("red", nil) == nil {
		t.Fatal("accepted level red")
	}
}
