package main

// The router's own index of every stream's resident blocks, kept from the gateway's `state`
// messages and live `batch`/`notice` messages (docs/protocol.md), and the longest-prefix lookup
// over it, with the same answer as the gateway's POST /v1/lookup by hashes.

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// StreamKey is one engine publisher: (source, dp_rank).
type StreamKey struct {
	Source string
	DPRank int
}

// BlockKey is one block of a stream: within a medium, the same hash in another KV-cache group is
// another block. Hashes stay strings, exactly as the gateway renders them: vLLM's unsigned 64-bit
// hashes do not fit in an int64 and lose digits as float64.
type BlockKey struct {
	Medium string
	Group  int
	Hash   string
}

// Stream is one stream's state.
type Stream struct {
	Blocks    map[BlockKey]int // reference count (>= 1)
	BlockSize map[string]int   // medium -> last known block size (0: unknown)
	Stale     bool
	Sum       uint64 // the state digest of Blocks, kept as they change (digest.go)
}

func newStream() *Stream {
	return &Stream{Blocks: map[BlockKey]int{}, BlockSize: map[string]int{}}
}

// Index holds every stream the router follows.
type Index struct {
	Streams map[StreamKey]*Stream
	Epoch   string
	Offset  int64 // the gateway offset the index reflects
}

// NewIndex returns an empty index.
func NewIndex() *Index { return &Index{Streams: map[StreamKey]*Stream{}} }

func (ix *Index) stream(k StreamKey) *Stream {
	s := ix.Streams[k]
	if s == nil {
		s = newStream()
		ix.Streams[k] = s
	}
	return s
}

// NormaliseMedium is the gateway's medium name: upper case; none or "" is GPU.
func NormaliseMedium(m *string) string {
	if m == nil || *m == "" {
		return "GPU"
	}
	return strings.ToUpper(*m)
}

var tierPrefixes = []struct{ prefix, tier string }{
	{"GPU", "GPU"}, {"CUDA", "GPU"}, {"HBM", "GPU"}, {"DEVICE", "GPU"},
	{"CPU", "CPU"}, {"HOST", "CPU"}, {"DRAM", "CPU"}, {"PINNED", "CPU"},
	{"DISK", "DISK"}, {"STORAGE", "DISK"}, {"SSD", "DISK"}, {"NVME", "DISK"}, {"FILE", "DISK"}, {"HDD", "DISK"},
}

// TierRank orders mediums as the gateway lists them: GPU, CPU, DISK, EXTERNAL tiers.
func TierRank(medium string) int {
	for _, p := range tierPrefixes {
		if strings.HasPrefix(medium, p.prefix) {
			switch p.tier {
			case "GPU":
				return 0
			case "CPU":
				return 1
			default:
				return 2
			}
		}
	}
	return 3
}

// --- messages ---------------------------------------------------------------------------

// Message is any gateway message; only the fields this router uses.
type Message struct {
	Type       string          `json:"type"`
	ID         string          `json:"id"`
	Epoch      string          `json:"epoch"`
	Offset     int64           `json:"offset"`
	Recovered  bool            `json:"recovered"`
	Sources    []SourceStatus  `json:"sources"`
	Source     string          `json:"source"`
	DPRank     int             `json:"dp_rank"`
	Kind       string          `json:"kind"`
	Events     []Event         `json:"events"`
	Blocks     []StateBlock    `json:"blocks"`
	BlockSizes map[string]int  `json:"block_sizes"` // a stream's last state chunk: medium -> block size
	Stale      bool            `json:"stale"`       // a state's: the stream's state is incomplete
	Last       bool            `json:"last"`        // a state's: its stream's last chunk
	Occupancy  json.RawMessage `json:"occupancy"`
	Digest     string          `json:"digest"`      // a digest message's (and a last state chunk's)
	BlockCount int             `json:"block_count"` // a digest message's: the stream's resident blocks
	// Engine seqs are decimal strings (uint64: TensorRT-LLM's exceed 2^53); ParseSeq reads one.
	Seq      string  `json:"seq"`      // a batch's, a restart's, a stale notice's
	Previous *string `json:"previous"` // a restart's: nil when none was delivered before it
	First    string  `json:"first"`    // an unrecovered_gap's lost range, inclusive
	Until    string  `json:"until"`
	Count    int64   `json:"count"`
}

// ParseSeq reads an engine seq as the gateway sends it, a decimal string, exactly.
func ParseSeq(text string) (uint64, error) { return strconv.ParseUint(text, 10, 64) }

// IsLast tells whether a state message is its stream's last chunk.
func (m *Message) IsLast() bool { return m.Last }

// SourceStatus is one entry of the hello's sources.
type SourceStatus struct {
	Source string `json:"source"`
	DPRank int    `json:"dp_rank"`
	Stale  bool   `json:"stale"`
}

// Event is a block event as the gateway renders it (engine field names).
type Event struct {
	Type        string          `json:"type"`
	BlockHashes []string        `json:"block_hashes"`
	BlockSize   int             `json:"block_size"`
	Medium      *string         `json:"medium"`
	GroupIdx    json.RawMessage `json:"group_idx"`
}

// Group is the event's KV-cache group: 0 when absent, null or not an integer (as the gateway's index).
func (e *Event) Group() int {
	var g int
	if len(e.GroupIdx) == 0 || json.Unmarshal(e.GroupIdx, &g) != nil {
		return 0
	}
	return g
}

// StateBlock is one block of a `state` message.
type StateBlock struct {
	Hash      string `json:"hash"`
	Refs      int    `json:"refs"`
	Medium    string `json:"medium"`
	GroupIdx  *int   `json:"group_idx"`
	BlockSize *int   `json:"block_size"`
}

// --- applying messages --------------------------------------------------------------------

// Hello starts a connection. Not recovered: every stream starts over from the state messages
// that follow (a stream with no state message has no block).
func (ix *Index) Hello(m *Message) {
	ix.Epoch = m.Epoch
	ix.Offset = m.Offset
	if !m.Recovered {
		ix.Streams = map[StreamKey]*Stream{}
		for _, src := range m.Sources { // staleness at connect
			ix.stream(StreamKey{src.Source, src.DPRank}).Stale = src.Stale
		}
	}
}

// State applies one chunk of a stream's snapshot (the stream was emptied by the hello).
func (ix *Index) State(m *Message) {
	s := ix.stream(StreamKey{m.Source, m.DPRank})
	s.Stale = m.Stale
	for _, b := range m.Blocks {
		group := 0
		if b.GroupIdx != nil {
			group = *b.GroupIdx
		}
		refs := b.Refs
		if refs < 1 {
			refs = 1
		}
		s.addRefs(BlockKey{b.Medium, group, b.Hash}, refs)
		if b.BlockSize != nil && *b.BlockSize > 0 {
			s.BlockSize[b.Medium] = *b.BlockSize
		}
	}
	for medium, size := range m.BlockSizes { // also mediums with no block now
		if size > 0 {
			s.BlockSize[medium] = size
		}
	}
}

// Batch applies one engine batch in order.
func (ix *Index) Batch(m *Message) {
	s := ix.stream(StreamKey{m.Source, m.DPRank})
	for i := range m.Events {
		e := &m.Events[i]
		switch e.Type {
		case "BlockStored":
			medium := NormaliseMedium(e.Medium)
			group := e.Group()
			for _, h := range e.BlockHashes {
				s.addRefs(BlockKey{medium, group, h}, 1)
			}
			if e.BlockSize > 0 {
				s.BlockSize[medium] = e.BlockSize
			}
		case "BlockRemoved":
			medium := NormaliseMedium(e.Medium)
			group := e.Group()
			for _, h := range e.BlockHashes {
				s.takeRef(BlockKey{medium, group, h})
			}
		case "AllBlocksCleared":
			s.empty()
			s.Stale = false
		}
	}
	ix.Offset = m.Offset
}

// Notice applies a stream notice: a restart empties the stream; a stale notice marks it stale
// (unrecovered_gap and degraded change nothing: a loss that leaves the state incomplete is
// followed by a stale notice).
func (ix *Index) Notice(m *Message) {
	if m.Source == "" {
		return // a per-client notice (slow_consumer): the connection ends, nothing to apply
	}
	s := ix.stream(StreamKey{m.Source, m.DPRank})
	switch m.Kind {
	case "restart":
		s.empty()
		s.Stale = false
	case "stale":
		s.Stale = true
	}
	ix.Offset = m.Offset
}

// --- lookup -------------------------------------------------------------------------------

// MediumAnswer is one medium's leading blocks.
type MediumAnswer struct {
	Blocks int  `json:"blocks"`
	Tokens *int `json:"tokens"`
}

// StreamAnswer is one stream's entry of a lookup answer.
type StreamAnswer struct {
	Source  string                  `json:"source"`
	DPRank  int                     `json:"dp_rank"`
	Blocks  int                     `json:"blocks"`
	Tokens  *int                    `json:"tokens"`
	Mediums map[string]MediumAnswer `json:"mediums"`
	Stale   bool                    `json:"stale"` // the stream's state is incomplete: prefer another
}

// Answer is the lookup answer, as POST /v1/lookup gives it.
type Answer struct {
	Offset  int64          `json:"offset"`
	Streams []StreamAnswer `json:"streams"`
}

func times(blocks, size int) *int {
	if size <= 0 {
		return nil
	}
	v := blocks * size
	return &v
}

// Lookup counts, for every stream, the leading blocks of the chain resident in some medium and in
// each medium. group < 0: any KV-cache group; otherwise that group only.
func (ix *Index) Lookup(chain []string, group int) Answer {
	answers := make([]StreamAnswer, 0, len(ix.Streams))
	for key, s := range ix.Streams {
		groups := s.groups()
		held := func(medium string, h string) bool {
			for g := range groups[medium] {
				if group >= 0 && g != group {
					continue
				}
				if s.Blocks[BlockKey{medium, g, h}] > 0 {
					return true
				}
			}
			return false
		}
		perMedium := map[string]int{}
		best := 0
		for medium := range groups {
			n := 0
			for _, h := range chain {
				if !held(medium, h) {
					break
				}
				n++
			}
			perMedium[medium] = n
			if n > best {
				best = n
			}
		}
		for best < len(chain) {
			found := false
			for medium := range groups {
				if held(medium, chain[best]) {
					found = true
					break
				}
			}
			if !found {
				break
			}
			best++
		}
		streamSize := s.fallbackSize()
		listed := map[string]MediumAnswer{}
		for medium, n := range perMedium {
			if n == 0 {
				continue
			}
			size := s.BlockSize[medium]
			if size <= 0 {
				size = streamSize
			}
			listed[medium] = MediumAnswer{n, times(n, size)}
		}
		answers = append(answers, StreamAnswer{key.Source, key.DPRank, best, times(best, streamSize), listed, s.Stale})
	}
	sort.Slice(answers, func(i, j int) bool {
		a, b := answers[i], answers[j]
		if a.Blocks != b.Blocks {
			return a.Blocks > b.Blocks
		}
		at, bt := 0, 0
		if a.Tokens != nil {
			at = *a.Tokens
		}
		if b.Tokens != nil {
			bt = *b.Tokens
		}
		if at != bt {
			return at > bt
		}
		if a.Source != b.Source {
			return a.Source < b.Source
		}
		return a.DPRank < b.DPRank
	})
	return Answer{ix.Offset, answers}
}

// groups lists, per medium, the groups that hold at least one block.
func (s *Stream) groups() map[string]map[int]bool {
	out := map[string]map[int]bool{}
	for k := range s.Blocks {
		if out[k.Medium] == nil {
			out[k.Medium] = map[int]bool{}
		}
		out[k.Medium][k.Group] = true
	}
	return out
}

// fallbackSize is the stream's block size: the first known one in tier order (0: unknown).
func (s *Stream) fallbackSize() int {
	mediums := []string{}
	for m, size := range s.BlockSize {
		if size > 0 {
			mediums = append(mediums, m)
		}
	}
	sort.Slice(mediums, func(i, j int) bool {
		ri, rj := TierRank(mediums[i]), TierRank(mediums[j])
		if ri != rj {
			return ri < rj
		}
		return mediums[i] < mediums[j]
	})
	if len(mediums) == 0 {
		return 0
	}
	return s.BlockSize[mediums[0]]
}

// --- the index as GET /v1/blocks shows it -------------------------------------------------

// DocBlock is one block as GET /v1/blocks shows it (the fields the router compares).
type DocBlock struct {
	Hash     string `json:"hash"`
	Refs     int    `json:"refs"`
	Medium   string `json:"medium"`
	GroupIdx int    `json:"group_idx"`
}

// DocStream is one stream of the document.
type DocStream struct {
	Source string     `json:"source"`
	DPRank int        `json:"dp_rank"`
	Stale  bool       `json:"stale"`
	Digest string     `json:"digest"` // the router's own state digest
	Blocks []DocBlock `json:"blocks"`
}

// Document is the router's index in the shape of GET /v1/blocks (blocks sorted, streams with no
// block left out), so that a test can compare it with the gateway's.
func (ix *Index) Document() map[string]interface{} {
	streams := []DocStream{}
	for key, s := range ix.Streams {
		if len(s.Blocks) == 0 {
			continue
		}
		blocks := make([]DocBlock, 0, len(s.Blocks))
		for k, refs := range s.Blocks {
			blocks = append(blocks, DocBlock{k.Hash, refs, k.Medium, k.Group})
		}
		sort.Slice(blocks, func(i, j int) bool { return blocks[i].less(blocks[j]) })
		streams = append(streams, DocStream{key.Source, key.DPRank, s.Stale, HexDigest(s.Sum), blocks})
	}
	sort.Slice(streams, func(i, j int) bool {
		if streams[i].Source != streams[j].Source {
			return streams[i].Source < streams[j].Source
		}
		return streams[i].DPRank < streams[j].DPRank
	})
	return map[string]interface{}{"epoch": ix.Epoch, "offset": ix.Offset, "streams": streams}
}

func (b DocBlock) less(o DocBlock) bool {
	if b.Medium != o.Medium {
		return b.Medium < o.Medium
	}
	if b.GroupIdx != o.GroupIdx {
		return b.GroupIdx < o.GroupIdx
	}
	return b.Hash < o.Hash
}

// String is a short summary for logs.
func (ix *Index) String() string {
	n := 0
	for _, s := range ix.Streams {
		n += len(s.Blocks)
	}
	return fmt.Sprintf("%d streams, %d blocks at %s:%d", len(ix.Streams), n, ix.Epoch, ix.Offset)
}
