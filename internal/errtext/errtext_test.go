package errtext

import (
	"errors"
	"testing"
)

func TestOneLine(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                                       "plain",
		"ERROR: bad\nDETAIL: the row\n":               "ERROR: bad; DETAIL: the row;",
		"  several   spaces\tand a tab ":              "several spaces and a tab",
		"unmarshal errors:\n  line 3: x\n  line 4: y": "unmarshal errors:; line 3: x; line 4: y",
	} {
		if got := OneLine(errors.New(in)); got != want {
			t.Errorf("OneLine(%q) = %q, want %q", in, got, want)
		}
	}
}
