package memcolo

// The shared allow-rate gate vectors (sdk/testvectors/gate.json, generated from the
// Rust SDK's gate): every case replayed on AllowRateGate with a synthetic clock.

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"testing"
	"time"
)

type gateStep struct {
	Op       string  `json:"op"`
	TNs      int64   `json:"t_ns"`
	Level    string  `json:"level"`
	Rate     float64 `json:"rate"`
	Admitted []bool  `json:"admitted"`
	EpochNs  *int64  `json:"epoch_ns"`
}

type gateCase struct {
	Name       string     `json:"name"`
	NumEpochs  int        `json:"num_epochs"`
	MinEpochNs int64      `json:"min_epoch_ns"`
	Steps      []gateStep `json:"steps"`
}

func TestGateVectors(t *testing.T) {
	b, err := os.ReadFile("../testvectors/gate.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []gateCase `json:"cases"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) == 0 {
		t.Fatal("gate.json has no cases")
	}
	base := time.Now()
	at := func(ns int64) time.Time { return base.Add(time.Duration(ns)) }
	for _, c := range file.Cases {
		t.Run(c.Name, func(t *testing.T) {
			g := NewAllowRateGate(c.NumEpochs)
			g.SetMinEpoch(time.Duration(c.MinEpochNs))
			for i, s := range c.Steps {
				switch s.Op {
				case "signal":
					if s.Level != "low" {
						g.SignalReceived(at(s.TNs))
					}
				case "handled":
					if s.Level != "low" {
						g.SignalHandled(at(s.TNs))
					}
				case "rate":
					if got := g.AllowRateAt(at(s.TNs)); math.Abs(got-s.Rate) > 1e-12 {
						t.Errorf("step %d %+v: rate %v, want %v", i, s, got, s.Rate)
					}
				case "admit":
					got := make([]bool, len(s.Admitted))
					for k := range got {
						got[k] = g.AdmitAt(at(s.TNs))
					}
					if !reflect.DeepEqual(got, s.Admitted) {
						t.Errorf("step %d at %d ns: admitted %v, want %v", i, s.TNs, got, s.Admitted)
					}
				case "epoch":
					e, ok := g.Epoch()
					if s.EpochNs == nil {
						if ok {
							t.Errorf("step %d: epoch %v, want none", i, e)
						}
					} else if !ok || int64(e) != *s.EpochNs {
						t.Errorf("step %d: epoch %v (%v), want %d ns", i, e, ok, *s.EpochNs)
					}
				default:
					t.Fatalf("step %d: unknown op %q", i, s.Op)
				}
			}
		})
	}
}
