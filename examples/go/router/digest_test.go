package main

import (
	"fmt"
	"math/rand"
	"testing"
)

// The test vectors of docs/protocol.md, "State digest".
var vectors = []struct {
	key  BlockKey
	want string
}{
	{BlockKey{"GPU", 0, "15760518052499183552"}, "3507684041cdf1ef"},
	{BlockKey{"GPU", 0, "42"}, "a35ca2b5829f0e51"},
	{BlockKey{"GPU", 1, "-7"}, "271ae3ad40f2b726"},
	{BlockKey{"CPU_PINNED", 0, "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}, "e6678d1a36eb822a"},
	{BlockKey{"DISK", 2, "18446744073709551615"}, "70808f1053f5217f"},
}

func TestDigestVectors(t *testing.T) {
	var sum uint64
	for _, v := range vectors {
		if got := HexDigest(Element(v.key)); got != v.want {
			t.Fatalf("element %v = %s, want %s", v.key, got, v.want)
		}
		sum += Element(v.key)
	}
	if got := HexDigest(sum); got != "56670acd90405b0f" {
		t.Fatalf("all five = %s", got)
	}
	if got := HexDigest(Element(vectors[0].key) + Element(vectors[1].key)); got != "d8640af5c46d0040" {
		t.Fatalf("the first two = %s", got)
	}
	if got := HexDigest(0); got != "0000000000000000" {
		t.Fatalf("empty = %s", got)
	}
}

func recomputed(s *Stream) uint64 {
	var sum uint64
	for k := range s.Blocks {
		sum += Element(k)
	}
	return sum
}

func TestDigestKeptEqualsRecomputed(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	r := NewRouter(nil, nil)
	feed(t, r, hello(1, false, "a"), `{"type":"state","offset":1,"source":"a","dp_rank":0,"blocks":[{"hash":"5","refs":2,"medium":"GPU","tier":"GPU","group_idx":1,"block_size":16}],"last":true}`)
	mediums := []string{`null`, `"gpu"`, `"CPU"`}
	for offset := 2; offset < 400; offset++ {
		var event string
		hashes := fmt.Sprintf(`["%d","%d"]`, rng.Intn(12), rng.Intn(12))
		medium := mediums[rng.Intn(len(mediums))]
		switch roll := rng.Intn(20); {
		case roll < 11:
			event = fmt.Sprintf(`{"type":"BlockStored","block_hashes":%s,"block_size":16,"medium":%s,"group_idx":%d}`, hashes, medium, rng.Intn(2))
		case roll < 19:
			event = fmt.Sprintf(`{"type":"BlockRemoved","block_hashes":%s,"medium":%s,"group_idx":%d}`, hashes, medium, rng.Intn(2))
		default:
			event = `{"type":"AllBlocksCleared"}`
		}
		feed(t, r, batch(offset, "a", event))
		s := r.index.Streams[StreamKey{"a", 0}]
		if s.Sum != recomputed(s) {
			t.Fatalf("offset %d: kept %x, recomputed %x", offset, s.Sum, recomputed(s))
		}
	}
}

func TestDigestMessagesAreCheckedAndADriftCounted(t *testing.T) {
	r := NewRouter(nil, nil)
	key := vectors[0].key
	feed(t, r, hello(1, false, "a"),
		`{"type":"state","offset":1,"source":"a","dp_rank":0,"blocks":[{"hash":"`+key.Hash+`","refs":1,"medium":"GPU","tier":"GPU","group_idx":0,"block_size":16}],"last":true}`,
		`{"type":"digest","source":"a","dp_rank":0,"offset":1,"digest":"3507684041cdf1ef","block_count":1}`)
	if r.digests != (DigestChecks{1, 0, 0}) {
		t.Fatalf("after a matching digest: %+v", r.digests)
	}
	if dropped := r.index.DropOne(); dropped != "a:0 GPU/0/"+key.Hash {
		t.Fatalf("dropped %q", dropped)
	}
	feed(t, r, `{"type":"digest","source":"a","dp_rank":0,"offset":1,"digest":"3507684041cdf1ef","block_count":1}`)
	if r.digests != (DigestChecks{2, 1, 2}) {
		t.Fatalf("after a drift: %+v", r.digests)
	}
	r.resync = true // the live router starts over instead
	if err := r.Handle([]byte(`{"type":"digest","source":"a","dp_rank":0,"offset":1,"digest":"3507684041cdf1ef","block_count":1}`)); err != errDrifted || r.lastID != "" {
		t.Fatalf("a live router's drift: %v, last id %q", err, r.lastID)
	}
}
