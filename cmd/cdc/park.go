package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/park"
)

// cdc parked and cdc redrive (docs/operations.md, "Parked keys").

func parkedCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("parked", "--config F [--json]")
	config := fs.String("config", "", "the YAML config file of the pipeline (required)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" {
		return c.usageErr("parked needs --config")
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	keys, err := p.Ops().Parked(ctx)
	if err != nil {
		log.Error("could not read the parked keys", "error", errtext.OneLine(err))
		return 1
	}
	if *asJSON {
		type parked struct {
			Table   string    `json:"table"`
			Topic   string    `json:"topic"`
			Key     string    `json:"key"`
			Reason  string    `json:"reason"`
			First   string    `json:"first_event_id"`
			Events  int64     `json:"events"`
			Since   time.Time `json:"since"`
			Parked  string    `json:"parked_topic"`
			Episode string    `json:"episode"`
		}
		out := []parked{}
		for _, k := range keys {
			out = append(out, parked{k.Table, k.Dest, k.Key, k.Reason, k.First, k.Events, k.Since, k.Topic, k.Episode})
		}
		enc := json.NewEncoder(c.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return 1
		}
		return 0
	}
	if len(keys) == 0 {
		fmt.Fprintln(c.stdout, "no key is parked")
		return 0
	}
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TABLE\tKEY\tTOPIC\tEVENTS\tSINCE\tREASON")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", shown(k.Table), shown(k.Key), shown(k.Dest), k.Events-k.Released, k.Since.UTC().Format(time.RFC3339), shown(k.Reason))
	}
	w.Flush()
	return 0
}

// shown is s as a terminal may print it: a key or a topic is the
// application's, and a control character in it would be the terminal's to
// obey, so a string with one is shown quoted, escaped.
func shown(s string) string {
	for _, r := range s {
		if !unicode.IsGraphic(r) || r == '\t' {
			return strconv.Quote(s)
		}
	}
	return s
}

func redriveCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("redrive", "--config F (--key K [--table NAME] | --table NAME | --all) [--drop-first | --drop-invalid] [--accept-gap] [--no-wait]")
	config := fs.String("config", "", "the YAML config file of the pipeline (required)")
	key := fs.String("key", "", "the parked key (aggregate id) to send on")
	table := fs.String("table", "", "only the keys whose parking began with an event of this table, the TABLE cdc parked shows (with --key: that key of this table)")
	all := fs.Bool("all", false, "every parked key")
	dropFirst := fs.Bool("drop-first", false, "send each key's first parked event not sent yet (the invalid one) to the dead-letter topic, and the rest on")
	dropInvalid := fs.Bool("drop-invalid", false, "send each key's parked events that are still invalid (the first or any behind it: events nobody will fix) to the dead-letter topic, and the rest on, in order")
	acceptGap := fs.Bool("accept-gap", false, "send what the parked topic still holds of a key whose parked records are gone (a redrive refused for it), accepting the loss")
	noWait := fs.Bool("no-wait", false, "return once the request is made, without following it")
	if code, ok := c.parse(fs, args); !ok {
		return code
	}
	if *config == "" || (*key == "" && *table == "" && !*all) || (*all && (*key != "" || *table != "")) {
		return c.usageErr("redrive needs --config and one of --key K (optionally with --table), --table NAME or --all")
	}
	p, log, code, ok := c.pipeline(*config)
	if !ok {
		return code
	}
	sel := park.Selector{Key: *key, All: *all}
	if *table != "" {
		t, err := findTable(p.Config().Tables, *table)
		if err != nil {
			return c.usageErr("--table %v", err)
		}
		sel.Table = t.String()
	}
	r, err := p.Ops().Redrive(ctx, sel, ops.RedriveOptions{DropFirst: *dropFirst, DropInvalid: *dropInvalid, AcceptGap: *acceptGap})
	if err != nil {
		log.Error("redrive not started", "error", errtext.OneLine(err))
		return 1
	}
	events := int64(0)
	for _, k := range r.Keys {
		events += k.Events - k.Released
	}
	for _, req := range r.Requests {
		fmt.Fprintf(c.stdout, "requested redrive %s of %d parked keys\n", req.ID, len(req.Parkings))
	}
	fmt.Fprintf(c.stdout, "%d parked keys, %d events, in %d requests\n", len(r.Keys), events, len(r.Requests))
	if *noWait {
		fmt.Fprintln(c.stdout, "the connector runs it where the stream reaches the request (or as it starts again); cdc parked shows what stays parked")
		return 0
	}
	done, err := p.Ops().WatchRedrive(ctx, r)
	for _, u := range done {
		fmt.Fprintf(c.stdout, "%s: %s\n", u.ID, shown(u.Outcome))
	}
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(c.stdout, "stopped following; the connector runs the redrive, and cdc parked shows what stays parked")
		return 0
	case errors.Is(err, ops.ErrNotTaken):
		log.Error("redrive not run: no connector took the request within the time it may be taken; check that the connector runs (cdc status), then run cdc redrive again", "taken", len(done), "requests", len(r.Requests))
		return 1
	case err != nil:
		log.Error("could not follow the redrive", "error", errtext.OneLine(err))
		return 1
	}
	for _, u := range done {
		if !u.Done {
			fmt.Fprintln(c.stdout, "some keys stay parked: cdc parked shows them, with why")
			return 1
		}
	}
	fmt.Fprintf(c.stdout, "redrove %d parked keys\n", len(r.Keys))
	return 0
}
