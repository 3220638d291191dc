// Package errtext puts an error's text on one line, for the log and for
// the one-line errors the commands print. Postgres, yaml.v3 and franz-go
// write some errors over several lines ("ERROR: ...\nDETAIL: ..."), and a
// log line or a stored checkpoint field must stay one line. Fatal names
// the errors only an operator can fix, which stop the connector. It
// imports nothing of the project, so every package can use it.
package errtext

import "strings"

// OneLine is err's text on one line: each line break becomes "; ", and each
// run of white space one space.
func OneLine(err error) string { return Flatten(err.Error()) }

// Flatten is OneLine for a message already in hand.
func Flatten(msg string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", "; ")), " ")
}
