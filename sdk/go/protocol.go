// The wire protocol, version 1 (docs/protocol.md): one JSON object per line with a
// version "v" and a "type". Sizes are bytes, durations milliseconds.

package memcolo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ProtocolVersion is the protocol version this package speaks.
const ProtocolVersion = 1

// MaxLineBytes is the longest line a peer may send, newline excluded.
const MaxLineBytes = 64 * 1024

// DefaultSocket is the agent's default socket path.
const DefaultSocket = "/run/memcolo/agent.sock"

// Error codes of docs/protocol.md §7.
const (
	CodeBadRequest         = "bad_request"
	CodeUnsupportedVersion = "unsupported_version"
	CodePermissionDenied   = "permission_denied"
	CodeNoSuchProcess      = "no_such_process"
	CodeNotRegistered      = "not_registered"
	CodeInternal           = "internal"
	CodeLimitExceeded      = "limit_exceeded"
)

// ProtocolError is a line that cannot be decoded; Code is the protocol error code
// a receiver answers it with (CodeBadRequest or CodeUnsupportedVersion).
type ProtocolError struct {
	Code    string
	Message string
}

func (e *ProtocolError) Error() string { return e.Code + ": " + e.Message }

func malformed(format string, args ...any) error {
	return &ProtocolError{Code: CodeBadRequest, Message: "malformed message: " + fmt.Sprintf(format, args...)}
}

// Message is any protocol message; Type is its "type" on the wire.
type Message interface{ Type() string }

// Requests (client -> agent).

// Register registers a process (the peer itself when PID is nil).
type Register struct {
	PID                  *int32  `json:"pid,omitempty"`
	Class                string  `json:"class"`
	Name                 *string `json:"name,omitempty"`
	ExpectedReclaimBytes *uint64 `json:"expected_reclaim_bytes,omitempty"`
	Notify               string  `json:"notify"` // "socket" (default when empty), "signal", "none"
}

// Unregister removes a registration.
type Unregister struct {
	PID *int32 `json:"pid,omitempty"`
}

// Reclaimed answers a Notify: bytes given back and the time taken (ms); OK false
// reports a failed or overlong handler.
type Reclaimed struct {
	PID        *int32  `json:"pid,omitempty"`
	Seq        *uint64 `json:"seq,omitempty"`
	Bytes      uint64  `json:"bytes"`
	DurationMs uint64  `json:"duration_ms"`
	OK         bool    `json:"ok"`
}

// StatusRequest asks for the agent's state.
type StatusRequest struct{}

// CgroupRequest asks for a child cgroup of the agent's scope.
type CgroupRequest struct {
	Name string `json:"name"`
}

// Ping is a liveness check.
type Ping struct{}

// Replies (agent -> client).

// OK: a request was carried out.
type OK struct{}

// Registered answers Register.
type Registered struct {
	PID   int32  `json:"pid"`
	Class string `json:"class"`
}

// CgroupReply answers CgroupRequest.
type CgroupReply struct {
	Path string `json:"path"`
}

// Pong answers Ping.
type Pong struct {
	AgentVersion string `json:"agent_version"`
}

// StatusReply answers StatusRequest with the agent's state as JSON.
type StatusReply struct {
	Status json.RawMessage `json:"status"`
}

// Notify is a memory-pressure notification: give back about TargetBytes, then
// answer with Reclaimed carrying Seq.
type Notify struct {
	Seq         uint64 `json:"seq"`
	Level       string `json:"level"` // "low", "high" or "top"
	TargetBytes uint64 `json:"target_bytes"`
}

// ErrorReply reports a failed request.
type ErrorReply struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (Register) Type() string      { return "register" }
func (Unregister) Type() string    { return "unregister" }
func (Reclaimed) Type() string     { return "reclaimed" }
func (StatusRequest) Type() string { return "status" }
func (CgroupRequest) Type() string { return "cgroup" }
func (Ping) Type() string          { return "ping" }
func (OK) Type() string            { return "ok" }
func (Registered) Type() string    { return "registered" }
func (CgroupReply) Type() string   { return "cgroup" }
func (Pong) Type() string          { return "pong" }
func (StatusReply) Type() string   { return "status" }
func (Notify) Type() string        { return "notify" }
func (ErrorReply) Type() string    { return "error" }

// Encode writes msg as one line, newline included, byte-identical to the reference
// implementation: keys v, type, then the fields in declaration order.
func Encode(msg Message) ([]byte, error) {
	if r, ok := msg.(Register); ok && r.Notify == "" {
		r.Notify = "socket"
		msg = r
	}
	var body bytes.Buffer
	enc := json.NewEncoder(&body)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(msg); err != nil {
		return nil, err
	}
	fields := bytes.TrimSpace(body.Bytes()) // {...}
	var out bytes.Buffer
	fmt.Fprintf(&out, `{"v":%d,"type":%q`, ProtocolVersion, msg.Type())
	if len(fields) > 2 {
		out.WriteByte(',')
		out.Write(fields[1:])
	} else {
		out.WriteByte('}')
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

type object map[string]json.RawMessage

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func parseUint(raw json.RawMessage) (uint64, bool) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || strings.ContainsAny(s, ".eE+-\"") {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

func (o object) u64(key string) (*uint64, error) {
	raw, ok := o[key]
	if !ok || isNull(raw) {
		return nil, nil
	}
	v, ok := parseUint(raw)
	if !ok {
		return nil, malformed("`%s` is not an unsigned 64-bit integer", key)
	}
	return &v, nil
}

func (o object) pid(key string) (*int32, error) {
	raw, ok := o[key]
	if !ok || isNull(raw) {
		return nil, nil
	}
	s := string(bytes.TrimSpace(raw))
	if strings.ContainsAny(s, ".eE+\"") {
		return nil, malformed("`%s` is not a pid", key)
	}
	v, err := strconv.ParseInt(s, 10, 32)
	if err != nil || v < math.MinInt32 || v > math.MaxInt32 {
		return nil, malformed("`%s` is not a pid", key)
	}
	p := int32(v)
	return &p, nil
}

func (o object) str(key string) (*string, error) {
	raw, ok := o[key]
	if !ok || isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, malformed("`%s` is not a string", key)
	}
	return &s, nil
}

func (o object) boolean(key string, def bool) (bool, error) {
	raw, ok := o[key]
	if !ok {
		return def, nil
	}
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, malformed("`%s` is not a boolean", key)
}

func required[T any](key string, get func(string) (*T, error)) (T, error) {
	var zero T
	v, err := get(key)
	if err != nil {
		return zero, err
	}
	if v == nil {
		return zero, malformed("missing field `%s`", key)
	}
	return *v, nil
}

func (o object) enum(key string, allowed []string, def string) (string, error) {
	raw, present := o[key]
	if !present && def != "" {
		return def, nil
	}
	var s string
	if !present || json.Unmarshal(raw, &s) != nil {
		if !present {
			return "", malformed("missing field `%s`", key)
		}
		return "", malformed("`%s` is not a string", key)
	}
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", malformed("unknown %s `%s`", key, s)
}

var (
	classes     = []string{"lc", "be", "elastic"}
	levels      = []string{"low", "high", "top"}
	notifyModes = []string{"socket", "signal", "none"}
	errorCodes  = []string{CodeBadRequest, CodeUnsupportedVersion, CodePermissionDenied, CodeNoSuchProcess, CodeNotRegistered, CodeInternal, CodeLimitExceeded}
)

func parseEnvelope(line []byte) (object, string, error) {
	line = bytes.TrimRight(line, "\r\n")
	if len(line) > MaxLineBytes {
		return nil, "", &ProtocolError{Code: CodeBadRequest, Message: fmt.Sprintf("line is %d bytes, over the %d-byte limit", len(line), MaxLineBytes)}
	}
	var o object
	if err := json.Unmarshal(line, &o); err != nil || o == nil {
		if err == nil {
			return nil, "", malformed("not a JSON object")
		}
		return nil, "", malformed("%v", err)
	}
	raw, ok := o["v"]
	if !ok {
		return nil, "", malformed("missing `v`")
	}
	v, ok := parseUint(raw)
	if !ok {
		return nil, "", malformed("`v` is not an unsigned integer")
	}
	if v > ProtocolVersion {
		return nil, "", &ProtocolError{Code: CodeUnsupportedVersion, Message: fmt.Sprintf("protocol version %d is newer than %d", v, ProtocolVersion)}
	}
	var t string
	if err := json.Unmarshal(o["type"], &t); err != nil {
		return nil, "", malformed("missing or non-string `type`")
	}
	return o, t, nil
}

// DecodeReply decodes one line sent by the agent. Errors are *ProtocolError.
func DecodeReply(line []byte) (Message, error) {
	o, t, err := parseEnvelope(line)
	if err != nil {
		return nil, err
	}
	switch t {
	case "ok":
		return OK{}, nil
	case "registered":
		p, err := required("pid", o.pid)
		if err != nil {
			return nil, err
		}
		c, err := o.enum("class", classes, "")
		if err != nil {
			return nil, err
		}
		return Registered{PID: p, Class: c}, nil
	case "cgroup":
		p, err := required("path", o.str)
		return CgroupReply{Path: p}, err
	case "pong":
		v, err := required("agent_version", o.str)
		return Pong{AgentVersion: v}, err
	case "status":
		raw, ok := o["status"]
		if !ok {
			return nil, malformed("missing field `status`")
		}
		return StatusReply{Status: raw}, nil
	case "notify":
		seq, err := required("seq", o.u64)
		if err != nil {
			return nil, err
		}
		level, err := o.enum("level", levels, "")
		if err != nil {
			return nil, err
		}
		target, err := required("target_bytes", o.u64)
		if err != nil {
			return nil, err
		}
		return Notify{Seq: seq, Level: level, TargetBytes: target}, nil
	case "error":
		code, err := o.enum("code", errorCodes, "")
		if err != nil {
			return nil, err
		}
		msg, err := required("message", o.str)
		return ErrorReply{Code: code, Message: msg}, err
	}
	return nil, malformed("unknown type `%s`", t)
}

// DecodeRequest decodes one line sent by a client. Errors are *ProtocolError.
func DecodeRequest(line []byte) (Message, error) {
	o, t, err := parseEnvelope(line)
	if err != nil {
		return nil, err
	}
	switch t {
	case "register":
		var r Register
		if r.PID, err = o.pid("pid"); err != nil {
			return nil, err
		}
		if r.Class, err = o.enum("class", classes, ""); err != nil {
			return nil, err
		}
		if r.Name, err = o.str("name"); err != nil {
			return nil, err
		}
		if r.ExpectedReclaimBytes, err = o.u64("expected_reclaim_bytes"); err != nil {
			return nil, err
		}
		if r.Notify, err = o.enum("notify", notifyModes, "socket"); err != nil {
			return nil, err
		}
		return r, nil
	case "unregister":
		p, err := o.pid("pid")
		return Unregister{PID: p}, err
	case "reclaimed":
		var r Reclaimed
		if r.PID, err = o.pid("pid"); err != nil {
			return nil, err
		}
		if r.Seq, err = o.u64("seq"); err != nil {
			return nil, err
		}
		if r.Bytes, err = required("bytes", o.u64); err != nil {
			return nil, err
		}
		if r.DurationMs, err = required("duration_ms", o.u64); err != nil {
			return nil, err
		}
		if r.OK, err = o.boolean("ok", true); err != nil {
			return nil, err
		}
		return r, nil
	case "status":
		return StatusRequest{}, nil
	case "cgroup":
		n, err := required("name", o.str)
		return CgroupRequest{Name: n}, err
	case "ping":
		return Ping{}, nil
	}
	return nil, malformed("unknown type `%s`", t)
}
