package opt

import (
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestValueTellsUnsetFromZero: a key left out, or null, keeps the
// default; a key set to the zero value is that value.
func TestValueTellsUnsetFromZero(t *testing.T) {
	type cfg struct {
		Delay Value[time.Duration] `yaml:"delay"`
		On    Value[bool]          `yaml:"on"`
	}
	for _, tc := range []struct {
		doc   string
		delay time.Duration
		on    bool
	}{
		{"{}", 5 * time.Millisecond, true},
		{"{delay: null, on: null}", 5 * time.Millisecond, true},
		{"{delay: 0s, on: false}", 0, false},
		{"{delay: 2ms, on: true}", 2 * time.Millisecond, true},
	} {
		var c cfg
		if err := yaml.Unmarshal([]byte(tc.doc), &c); err != nil {
			t.Fatalf("%s: %v", tc.doc, err)
		}
		if d, on := c.Delay.Or(5*time.Millisecond), c.On.Or(true); d != tc.delay || on != tc.on {
			t.Errorf("%s: delay %s on %v; want %s %v", tc.doc, d, on, tc.delay, tc.on)
		}
	}
	if Set(0).Or(7) != 0 || (Value[int]{}).Or(7) != 7 || (Value[int]{}).IsSet() {
		t.Fatal("Set and Or disagree")
	}
	var c cfg
	if err := yaml.Unmarshal([]byte("{delay: soon}"), &c); err == nil {
		t.Fatal("a value that is not a duration decoded")
	}
}
