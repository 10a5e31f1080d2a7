package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
)

func feed(t *testing.T, r *Router, lines ...string) {
	t.Helper()
	for _, line := range lines {
		if err := r.Handle([]byte(line)); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
}

func hello(offset int, recovered bool, sources ...string) string {
	list := "["
	for i, s := range sources {
		if i > 0 {
			list += ","
		}
		list += fmt.Sprintf(`{"source":%q,"dp_rank":0,"state":"up"}`, s)
	}
	return fmt.Sprintf(`{"type":"hello","epoch":"e1","offset":%d,"recovered":%t,"sources":%s,"occupancy":null}`, offset, recovered, list+"]")
}

func batch(offset int, source string, events string) string {
	return fmt.Sprintf(`{"type":"batch","id":"e1:%d","offset":%d,"source":%q,"dp_rank":0,"seq":"1","ts":0,"events":[%s]}`, offset, offset, source, events)
}

const big = "18446744073709539271" // above 2^63: never a number

func refs(r *Router, source, medium string, group int, hash string) int {
	s := r.index.Streams[StreamKey{source, 0}]
	if s == nil {
		return 0
	}
	return s.Blocks[BlockKey{medium, group, hash}]
}

func TestReferenceCounts(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, false, "a"), `{"type":"state","offset":1,"source":"a","dp_rank":0,"blocks":[],"last":true}`)
	feed(t, r,
		batch(2, "a", `{"type":"BlockStored","block_hashes":["`+big+`","7"],"parent_block_hash":null,"token_ids":[],"block_size":16,"medium":"gpu"}`),
		batch(3, "a", `{"type":"BlockStored","block_hashes":["`+big+`"],"block_size":16,"medium":null}`),
		batch(4, "a", `{"type":"BlockRemoved","block_hashes":["`+big+`","unknown"],"medium":"GPU"}`),
	)
	if got := refs(r, "a", "GPU", 0, big); got != 1 {
		t.Fatalf("refs after 2 stores and 1 remove = %d, want 1", got)
	}
	feed(t, r, batch(5, "a", `{"type":"BlockRemoved","block_hashes":["`+big+`"]}`))
	if got := refs(r, "a", "GPU", 0, big); got != 0 {
		t.Fatalf("refs = %d, want 0", got)
	}
	if r.lastID != "e1:5" || r.index.Offset != 5 {
		t.Fatalf("lastID %q offset %d", r.lastID, r.index.Offset)
	}
}

func TestGroupsAndMediumsAreSeparateBlocks(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, true),
		batch(2, "a", `{"type":"BlockStored","block_hashes":["1"],"block_size":16,"medium":"CPU","group_idx":1}`),
		batch(3, "a", `{"type":"BlockRemoved","block_hashes":["1"],"medium":"CPU"}`),
		batch(4, "a", `{"type":"BlockRemoved","block_hashes":["1"],"medium":"GPU","group_idx":1}`),
	)
	if refs(r, "a", "CPU", 1, "1") != 1 {
		t.Fatal("a remove from another group or medium must not touch the block")
	}
	feed(t, r, batch(5, "a", `{"type":"BlockStored","block_hashes":["2"],"block_size":16,"group_idx":"0"}`))
	if refs(r, "a", "GPU", 0, "2") != 1 {
		t.Fatal("a group_idx that is not an integer is group 0")
	}
}

func TestClearsAndRestarts(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, true),
		batch(2, "a", `{"type":"BlockStored","block_hashes":["1"],"block_size":16}`),
		batch(3, "b", `{"type":"BlockStored","block_hashes":["1"],"block_size":16}`),
		batch(4, "a", `{"type":"AllBlocksCleared"}`),
	)
	if refs(r, "a", "GPU", 0, "1") != 0 || refs(r, "b", "GPU", 0, "1") != 1 {
		t.Fatal("AllBlocksCleared empties its own stream only")
	}
	feed(t, r, `{"type":"notice","kind":"unrecovered_gap","id":"e1:5","offset":5,"source":"b","dp_rank":0,"first":"1","until":"2","count":2,"reason":"not_sent"}`)
	if r.index.Streams[StreamKey{"b", 0}].Stale {
		t.Fatal("a gap alone does not make the stream stale")
	}
	feed(t, r, `{"type":"notice","kind":"stale","id":"e1:5","offset":5,"source":"b","dp_rank":0,"reason":"unrecovered","seq":"1","detail":"x"}`)
	if !r.index.Streams[StreamKey{"b", 0}].Stale {
		t.Fatal("a stale notice marks the stream stale")
	}
	feed(t, r, `{"type":"notice","kind":"restart","id":"e1:6","offset":6,"source":"b","dp_rank":0,"seq":"0","previous":"9","reason":"seq_reset"}`)
	if refs(r, "b", "GPU", 0, "1") != 0 || r.index.Streams[StreamKey{"b", 0}].Stale {
		t.Fatal("a restart empties the stream and clears the doubt")
	}
	feed(t, r, `{"type":"notice","kind":"slow_consumer","reason":"x"}`)
	if r.lastID != "e1:6" {
		t.Fatalf("a notice without id must not move the resume point: %q", r.lastID)
	}
}

func TestSnapshotThenStreamAndResumePoint(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, true), batch(2, "old", `{"type":"BlockStored","block_hashes":["9"],"block_size":16}`))
	feed(t, r, hello(10, false, "a", "b"))
	if _, old := r.index.Streams[StreamKey{"old", 0}]; old || len(r.index.Streams) != 2 {
		t.Fatal("a fresh hello drops the old state and knows the hello's streams")
	}
	feed(t, r, `{"type":"state","offset":10,"source":"a","dp_rank":0,"blocks":[{"hash":"1","refs":2,"medium":"GPU","tier":"GPU","group_idx":0,"block_size":16}],"last":false}`)
	if r.lastID != "e1:2" || r.ready {
		t.Fatalf("mid-snapshot the resume point stays the old one: %q", r.lastID)
	}
	feed(t, r,
		`{"type":"state","offset":10,"source":"a","dp_rank":0,"blocks":[{"hash":"2","refs":1,"medium":"CPU","tier":"CPU","group_idx":null,"block_size":null}],"last":true}`,
		`{"type":"state","offset":10,"source":"b","dp_rank":0,"blocks":[],"last":true}`,
	)
	if r.lastID != "e1:10" || !r.ready {
		t.Fatalf("after every stream's last chunk the hello's id is the resume point: %q", r.lastID)
	}
	if refs(r, "a", "GPU", 0, "1") != 2 || refs(r, "a", "CPU", 0, "2") != 1 {
		t.Fatal("state blocks with their reference counts")
	}
	feed(t, r, batch(11, "a", `{"type":"BlockRemoved","block_hashes":["1"],"medium":"GPU"}`))
	if refs(r, "a", "GPU", 0, "1") != 1 || r.lastID != "e1:11" {
		t.Fatal("live batches apply on top of the snapshot")
	}
}

func TestFilteredSnapshotWaitsOnlyForMatchingStreams(t *testing.T) {
	r := NewRouter([]string{"a"}, nil)
	feed(t, r, hello(3, false, "a", "b"), `{"type":"state","offset":3,"source":"a","dp_rank":0,"blocks":[],"last":true}`)
	if r.lastID != "e1:3" {
		t.Fatalf("resume point %q", r.lastID)
	}
	r2 := NewRouter(nil, nil)
	feed(t, r2, hello(3, false, "a", "b"), `{"type":"state","offset":3,"source":"a","dp_rank":0,"blocks":[],"last":true}`,
		batch(4, "b", `{"type":"AllBlocksCleared"}`))
	if r2.lastID != "e1:4" || !r2.ready {
		t.Fatal("the first live message also ends the snapshot")
	}
}

func TestFramesHoldSeveralMessages(t *testing.T) {
	r := NewRouter(nil, nil)
	frame := hello(1, true) + "\n" + batch(2, "a", `{"type":"BlockStored","block_hashes":["5"],"block_size":4}`)
	if err := r.HandleFrame([]byte(frame)); err != nil {
		t.Fatal(err)
	}
	if refs(r, "a", "GPU", 0, "5") != 1 {
		t.Fatal("both messages of the frame applied")
	}
	if r.HandleFrame([]byte("{not json")) == nil {
		t.Fatal("a bad line is an error")
	}
}

func TestLongestPrefix(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, true),
		batch(2, "a", `{"type":"BlockStored","block_hashes":["1","2"],"block_size":16,"medium":"GPU"}`),
		batch(3, "a", `{"type":"BlockStored","block_hashes":["2","3"],"block_size":0,"token_ids":[],"medium":"CPU"}`),
		batch(4, "b", `{"type":"BlockStored","block_hashes":["1","2","3","4"],"block_size":32}`),
		batch(5, "c", `{"type":"BlockStored","block_hashes":["9"],"block_size":16}`),
		batch(6, "z", `{"type":"BlockStored","block_hashes":["1"],"block_size":0,"medium":"CPU"}`),
	)
	answer := r.index.Lookup([]string{"1", "2", "3", "4"}, -1)
	got, _ := json.Marshal(answer)
	want := `{"offset":6,"streams":[` +
		`{"source":"b","dp_rank":0,"blocks":4,"tokens":128,"mediums":{"GPU":{"blocks":4,"tokens":128}},"stale":false},` +
		`{"source":"a","dp_rank":0,"blocks":3,"tokens":48,"mediums":{"GPU":{"blocks":2,"tokens":32}},"stale":false},` +
		`{"source":"z","dp_rank":0,"blocks":1,"tokens":null,"mediums":{"CPU":{"blocks":1,"tokens":null}},"stale":false},` +
		`{"source":"c","dp_rank":0,"blocks":0,"tokens":0,"mediums":{},"stale":false}]}`
	if string(got) != want {
		t.Fatalf("lookup\n got %s\nwant %s", got, want)
	}
	feed(t, r, batch(7, "a", `{"type":"BlockStored","block_hashes":["1","2","3"],"block_size":16,"group_idx":1}`))
	a := r.index.Lookup([]string{"1", "2", "3"}, 1).Streams
	if a[0].Source != "a" || a[0].Blocks != 3 {
		t.Fatalf("group 1 only: %+v", a[0])
	}
	zero := r.index.Lookup([]string{"1"}, 5).Streams
	for _, s := range zero {
		if s.Blocks != 0 || !reflect.DeepEqual(s.Mediums, map[string]MediumAnswer{}) {
			t.Fatalf("no stream has group 5: %+v", s)
		}
	}
}

func TestWebSocketURL(t *testing.T) {
	r := NewRouter([]string{"a"}, []int{1})
	r.lastID = "e1:7"
	u, err := r.wsURL("https://kv.example.com/base/", "tok")
	if err != nil {
		t.Fatal(err)
	}
	want := "wss://kv.example.com/base/v1/ws?dp_rank=1&last_event_id=e1%3A7&snapshot=blocks&source=a&token=tok"
	if u != want {
		t.Fatalf("got %s\nwant %s", u, want)
	}
	if _, err := r.wsURL("ftp://x", ""); err == nil {
		t.Fatal("ftp is refused")
	}
}

func TestDocumentShape(t *testing.T) {
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, true),
		batch(2, "a", `{"type":"BlockStored","block_hashes":["2","1","1"],"block_size":16}`),
		batch(3, "e", `{"type":"AllBlocksCleared"}`),
	)
	got, _ := json.Marshal(r.index.Document())
	want := `{"epoch":"e1","offset":3,"streams":[{"source":"a","dp_rank":0,"stale":false,"digest":"01d283c8ed2e1431","blocks":[` +
		`{"hash":"1","refs":2,"medium":"GPU","group_idx":0},{"hash":"2","refs":1,"medium":"GPU","group_idx":0}]}]}`
	if string(got) != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// Engine seqs arrive as decimal strings: a TensorRT-LLM seq (time_ns, beyond 2^53) and a gap's
// range read exactly, so count == until - first + 1 holds on correct data.
func TestEngineSeqsAreExactBeyond2To53(t *testing.T) {
	var b, gap, restart Message
	for line, m := range map[string]*Message{
		`{"type":"batch","id":"e1:1","offset":1,"source":"a","dp_rank":0,"seq":"1789095808837884701","ts":1.5,"events":[]}`:                                                                    &b,
		`{"type":"notice","kind":"unrecovered_gap","id":"e1:2","offset":2,"source":"a","dp_rank":0,"first":"1789095808837884702","until":"1789095808837884711","count":10,"reason":"evicted"}`: &gap,
		`{"type":"notice","kind":"restart","id":"e1:3","offset":3,"source":"a","dp_rank":0,"seq":"0","previous":null,"reason":"seq_reset"}`:                                                    &restart,
	} {
		if err := json.Unmarshal([]byte(line), m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
	}
	seq, err := ParseSeq(b.Seq)
	if err != nil || seq != 1789095808837884701 {
		t.Fatalf("seq %q read as %d (%v)", b.Seq, seq, err)
	}
	first, _ := ParseSeq(gap.First)
	until, _ := ParseSeq(gap.Until)
	if until-first+1 != uint64(gap.Count) || first != seq+1 {
		t.Fatalf("gap %d..%d count %d", first, until, gap.Count)
	}
	if restart.Previous != nil {
		t.Fatalf("previous %q: null is none", *restart.Previous)
	}
	if _, err := ParseSeq("1.789e18"); err == nil {
		t.Fatal("a seq that is not a decimal integer must not parse")
	}
}
