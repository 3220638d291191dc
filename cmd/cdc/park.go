package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/outboxcdc/cdc/internal/errtext"
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
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", k.Table, k.Key, k.Dest, k.Events, k.Since.UTC().Format(time.RFC3339), k.Reason)
	}
	w.Flush()
	return 0
}

func redriveCmd(ctx context.Context, c *cli, args []string) int {
	fs := c.flags("redrive", "--config F (--key K [--table NAME] | --table NAME | --all) [--drop-first] [--no-wait]")
	config := fs.String("config", "", "the YAML config file of the running pipeline (required)")
	key := fs.String("key", "", "the parked key (aggregate id) to send on")
	table := fs.String("table", "", "only this table's parked keys (with --key: that key of this table)")
	all := fs.Bool("all", false, "every parked key")
	dropFirst := fs.Bool("drop-first", false, "send each key's first parked event (the invalid one) to the dead-letter topic, and the rest on")
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
	r, err := p.Ops().RequestRedrive(ctx, sel, *dropFirst)
	if err != nil {
		log.Error("redrive not started", "error", errtext.OneLine(err))
		return 1
	}
	events := int64(0)
	for _, k := range r.Keys {
		events += k.Events
	}
	fmt.Fprintf(c.stdout, "requested redrive %s of %d parked keys (%d events)\n", r.Request.ID, len(r.Keys), events)
	if *noWait {
		fmt.Fprintln(c.stdout, "the connector runs it where the stream reaches the request; cdc parked shows what stays parked")
		return 0
	}
	left, err := p.Ops().WatchRedrive(ctx, r)
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(c.stdout, "stopped following; the connector runs the redrive, and cdc parked shows what stays parked")
		return 0
	case err != nil:
		log.Error("could not follow the redrive", "error", errtext.OneLine(err))
		return 1
	}
	for _, k := range left {
		fmt.Fprintf(c.stdout, "key %s of %s stays parked: its first event is invalid still: %s\n", k.Key, k.Table, k.Reason)
	}
	fmt.Fprintf(c.stdout, "redrove %d of %d parked keys\n", len(r.Keys)-len(left), len(r.Keys))
	if len(left) > 0 {
		return 1
	}
	return 0
}
