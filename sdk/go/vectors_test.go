package memcolo

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

type vectorFile struct {
	ProtocolVersion int `json:"protocol_version"`
	MaxLineBytes    int `json:"max_line_bytes"`
	Valid           []struct {
		Name      string         `json:"name"`
		Line      string         `json:"line"`
		Canonical bool           `json:"canonical"`
		Message   map[string]any `json:"message"`
	} `json:"valid"`
	Invalid []struct {
		Name, Line, Code string
	} `json:"invalid"`
	TooLong struct {
		Prefix, Fill, Suffix, Code string
		Count                      int
	} `json:"too_long"`
}

func loadVectors(t *testing.T, name string) vectorFile {
	t.Helper()
	b, err := os.ReadFile("../testvectors/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber() // u64 values beyond 2^53 stay exact
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	if v.ProtocolVersion != ProtocolVersion || v.MaxLineBytes != MaxLineBytes {
		t.Fatalf("vectors are for version %d / %d bytes", v.ProtocolVersion, v.MaxLineBytes)
	}
	return v
}

// meaning converts a decoded message to the vectors' "message" form.
func meaning(t *testing.T, m Message) map[string]any {
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&out); err != nil {
		t.Fatal(err)
	}
	out["type"] = m.Type()
	return out
}

func checkVectors(t *testing.T, file string, decode func([]byte) (Message, error)) {
	v := loadVectors(t, file)
	for _, c := range v.Valid {
		m, err := decode([]byte(c.Line))
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if got := meaning(t, m); !reflect.DeepEqual(got, c.Message) {
			t.Errorf("%s: decoded %v, want %v", c.Name, got, c.Message)
		}
		if c.Canonical {
			line, err := Encode(m)
			if err != nil || string(line) != c.Line+"\n" {
				t.Errorf("%s: encoded %q (%v), want %q", c.Name, line, err, c.Line)
			}
		}
	}
	for _, c := range v.Invalid {
		_, err := decode([]byte(c.Line))
		pe, ok := err.(*ProtocolError)
		if !ok || pe.Code != c.Code {
			t.Errorf("%s: got %v, want code %s", c.Name, err, c.Code)
		}
	}
	tl := v.TooLong
	line := tl.Prefix + strings.Repeat(tl.Fill, tl.Count) + tl.Suffix
	if _, err := decode([]byte(line)); err == nil || err.(*ProtocolError).Code != tl.Code {
		t.Errorf("too long line: %v", err)
	}
}

func TestRequestVectors(t *testing.T) { checkVectors(t, "requests.json", DecodeRequest) }
func TestReplyVectors(t *testing.T)   { checkVectors(t, "replies.json", DecodeReply) }
