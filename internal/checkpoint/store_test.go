package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func fakeStore(t *testing.T, topic string) (*Store, *kfake.Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenStore(ctx, topic, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// TestStoreSaveLoad: the newest record of each key wins, a tombstone
// deletes, and an empty topic reads as no records.
func TestStoreSaveLoad(t *testing.T) {
	s, c := fakeStore(t, "cp")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := s.Load(ctx, false); err != nil || len(got) != 0 {
		t.Fatalf("empty topic: %v, %v", got, err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for i, r := range []Record{
		{Slot: "a", SystemID: "1", Confirmed: 100, UpdatedAt: at},
		{Slot: "b", SystemID: "1", Confirmed: 50, UpdatedAt: at},
		{Slot: "a", SystemID: "1", Confirmed: 200, CommitLSN: 150, CommitTime: at, UpdatedAt: at,
			Marks: Marks{{LSN: 10, Time: at}}, Window: Mark{LSN: 10, Time: at}, History: []Jump{{Kind: JumpRewind, From: 1, To: 2, At: at}}},
	} {
		if err := s.Save(ctx, r); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
	}
	// A second start opens the existing topic.
	if s, err := OpenStore(ctx, "cp", []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger()); err != nil || s.Topic() != "cp" {
		t.Fatalf("reopen: %v", err)
	}
	got, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	a := got[Key("a", "1")]
	if len(got) != 2 || a.Confirmed != 200 || a.CommitLSN != 150 || !a.CommitTime.Equal(at) || len(a.Marks) != 1 ||
		a.Window.LSN != 10 || len(a.History) != 1 || a.History[0].To != pglogrepl.LSN(2) {
		t.Fatalf("loaded %+v", got)
	}
	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "cp", Key: []byte(Key("b", "1"))}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Load(ctx, true); err != nil || len(got) != 1 {
		t.Fatalf("after a tombstone for b: %v, %v", got, err)
	}

	// A topic that would delete checkpoints is refused.
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "deleting"); err != nil {
		t.Fatal(err)
	}
	_, err = OpenStore(ctx, "deleting", []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger())
	var te *TopicError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "cleanup.policy=compact") {
		t.Fatalf("OpenStore on a delete-policy topic: %v; want a TopicError saying to set cleanup.policy=compact", err)
	}
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := cfgs.On("cp", nil)
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && (c.Value == nil || *c.Value != "compact") {
			t.Fatalf("cleanup.policy = %v", c.Value)
		}
	}
}

// TestStoreTopicSegments: the checkpoint topic is created with small
// segments that roll hourly, so that compaction, which cleans only rolled
// segments, keeps it small however many checkpoints were superseded.
func TestStoreTopicSegments(t *testing.T) {
	_, c := fakeStore(t, "cp")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := described.On("cp", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cleanup.policy": "compact", "segment.bytes": "1048576", "segment.ms": "3600000"}
	for _, cfg := range rc.Configs {
		if w, ok := want[cfg.Key]; ok {
			if cfg.Value == nil || *cfg.Value != w {
				t.Errorf("%s = %v, want %s", cfg.Key, cfg.Value, w)
			}
			delete(want, cfg.Key)
		}
	}
	if len(want) > 0 {
		t.Errorf("not set: %v", want)
	}
}

// TestStartOpen: the store opened in the background is the one OpenStore
// would give (its topic created compacted), and one whose context ends
// first says so rather than hand over a store.
func TestStartOpen(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := StartOpen(ctx, "bg", opts, hclog.NewNullLogger()).Wait()
	if err != nil || s.Topic() != "bg" {
		t.Fatalf("StartOpen: %v, %v", s, err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "bg")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := described.On("bg", nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := ""
	for _, cf := range rc.Configs {
		if cf.Key == "cleanup.policy" && cf.Value != nil {
			policy = *cf.Value
		}
	}
	if policy != "compact" {
		t.Fatalf("topic opened in the background has cleanup.policy=%q, want compact", policy)
	}

	ended, stop := context.WithCancel(context.Background())
	stop()
	if s, err := StartOpen(ended, "other", opts, hclog.NewNullLogger()).Wait(); err == nil || s != nil {
		t.Fatalf("StartOpen with an ended context gave %v, %v; want an error", s, err)
	}
}

// TestLoadRefusesARecordThatGoesBack: a genuine, signed record produced
// again after newer ones (a replay by someone who may write the topic)
// is skipped and counted: the newest stands, so the pipeline's position
// does not move back and a rewind is not undone.
func TestLoadRefusesARecordThatGoesBack(t *testing.T) {
	s, _ := fakeStore(t, "cp")
	s.SignWith([][]byte{[]byte("0123456789abcdef0123456789abcdef")})
	foreign := 0
	s.OnForeign = func() { foreign++ }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	old := Record{Slot: "a", SystemID: "1", Confirmed: 100, UpdatedAt: at, Seq: 1}
	rewound := Record{Slot: "a", SystemID: "1", Confirmed: 50, UpdatedAt: at, Seq: 2, History: []Jump{{Kind: JumpRewind, From: 100, To: 50, At: at}}}
	for _, r := range []Record{old, rewound, old} {
		if err := s.Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	if a := got[Key("a", "1")]; a.Confirmed != 50 || a.Seq != 2 || foreign != 1 {
		t.Fatalf("loaded confirmed %s seq %d with %d records skipped; want the rewound record (50, seq 2) and the replay skipped", a.Confirmed, a.Seq, foreign)
	}
}

// TestTablesJSON: what the stream covered of each table survives the
// checkpoint's JSON, a repair's snapshot's view (Seen) included; a record
// written before it was kept (ids only) knows nothing of a table's rows
// (NoFloor), and a gap accepted forgets it.
func TestTablesJSON(t *testing.T) {
	r := Record{Slot: "a", SystemID: "1", Tables: map[string]Table{
		"public.outbox": {Rel: 16385, Member: "rel:16400", Floor: 0, Former: []uint32{16300}},
		"public.other":  {Rel: 16390, Member: "all:16401", Floor: 1 << 33, Files: map[uint32]uint32{16390: 16500, 16392: 16501}},
		"public.new":    {Rel: 16391, Floor: NoFloor},
		"public.seen":   {Rel: 16395, Member: "rel:16402", Seen: &Seen{Xmin: 1<<32 + 5, Xmax: 1<<32 + 9, Xip: []uint64{1<<32 + 5, 1<<32 + 7}}},
	}, RetentionMarks: []RetentionMark{{XMin: 7, LSN: 9, Time: time.Unix(1, 0).UTC(), Timeline: 2}}}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Tables, r.Tables) || !reflect.DeepEqual(back.RetentionMarks, r.RetentionMarks) {
		t.Fatalf("round trip:\n got %+v %+v\nwant %+v %+v", back.Tables, back.RetentionMarks, r.Tables, r.RetentionMarks)
	}
	var old Record
	if err := json.Unmarshal([]byte(`{"slot":"a","system_identifier":"1","confirmed_lsn":"0/1","commit_lsn":"0/0","tables":{"public.outbox":16385}}`), &old); err != nil {
		t.Fatal(err)
	}
	if st := old.Tables["public.outbox"]; st.Rel != 16385 || st.Floor != NoFloor || st.Member != "" {
		t.Fatalf("a record written before streams were kept: %+v", st)
	}
	// A snapshot's view no snapshot could have is dropped: the stream
	// then passes over nothing.
	var forged Record
	if err := json.Unmarshal([]byte(`{"slot":"a","system_identifier":"1","confirmed_lsn":"0/1","commit_lsn":"0/0","tables":{"public.outbox":16385},
		"streams":{"public.outbox":{"floor":0,"seen":{"xmin":9,"xmax":5}}}}`), &forged); err != nil {
		t.Fatal(err)
	}
	if st := forged.Tables["public.outbox"]; st.Seen != nil || st.Floor != 0 {
		t.Fatalf("a record with xmin past xmax: %+v", st)
	}
	back.ForgetCoverage()
	if back.RetentionMarks != nil || back.Tables["public.outbox"].Floor != NoFloor || r.Tables["public.outbox"].Floor != 0 || back.Tables["public.seen"].Seen != nil {
		t.Fatalf("after ForgetCoverage: %+v %+v (the original: %+v)", back.Tables, back.RetentionMarks, r.Tables)
	}
}

// TestNoteTablesKeepsFloorZero: a first start's backfill lowers a table's
// Floor to 0 in the record (SetBackfill) while the watch's view, which
// every repair's note carries for all tables, still has the Floor of the
// session's start; applied as it was, the note put the Floor back up, and
// retention kept every row below it for ever. A relation's Floor 0 stays;
// another relation's record, or a Floor above 0 in both, is the note's.
func TestNoteTablesKeepsFloorZero(t *testing.T) {
	saved := map[string]Table{
		"public.a": {Rel: 1, Floor: 0},
		"public.b": {Rel: 2, Floor: 0},
		"public.c": {Rel: 3, Floor: 50, Files: map[uint32]uint32{3: 30}},
	}
	noted := map[string]Table{
		"public.a": {Rel: 1, Floor: 40, Files: map[uint32]uint32{1: 10}}, // stale
		"public.b": {Rel: 9, Member: "rel:9", Floor: 0},                  // repaired: another relation
		"public.c": {Rel: 3, Floor: 60, Files: map[uint32]uint32{3: 31}}, // a new Floor
		"public.d": {Rel: 4, Floor: 70},
	}
	got := NoteTables(saved, noted)
	want := map[string]Table{
		"public.a": {Rel: 1, Floor: 0},
		"public.b": {Rel: 9, Member: "rel:9", Floor: 0},
		"public.c": {Rel: 3, Floor: 60, Files: map[uint32]uint32{3: 31}},
		"public.d": {Rel: 4, Floor: 70},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if noted["public.a"].Floor != 40 {
		t.Fatal("the note was changed in place: it is shared with the tracker")
	}
}
