package decode

import "encoding/json"

// Control is one of the connector's own logical decoding messages (with
// ControlPrefix): a request's announcement, a chunk's watermarks,
// or a job's end.
type Control struct {
	Type  string `json:"type"` // ControlRequest, ControlLow, ControlHigh, ControlFail
	ID    string `json:"id,omitempty"`
	Run   string `json:"run,omitempty"`
	Job   string `json:"job,omitempty"`
	Chunk int    `json:"chunk,omitempty"`
	Error string `json:"error,omitempty"`
}

// The kinds of Control.
const (
	ControlRequest = "backfill-request"
	ControlLow     = "backfill-low"
	ControlHigh    = "backfill-high"
	ControlFail    = "backfill-fail"
)

// ParseControl reads a control message's content.
func ParseControl(b []byte) (Control, error) {
	var c Control
	err := json.Unmarshal(b, &c)
	return c, err
}

// ControlMessage is the SQL that announces backfill request id to a
// running pipeline, as cdc backfill does (on a primary).
func ControlMessage(id string) (string, []any) {
	b, _ := json.Marshal(Control{Type: ControlRequest, ID: id})
	return "SELECT pg_logical_emit_message(true, $1, $2::text)", []any{ControlPrefix, string(b)}
}
