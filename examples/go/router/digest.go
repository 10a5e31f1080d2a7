package main

// The state digest (docs/protocol.md, "State digest"): per stream, the sum modulo 2^64 of
// FNV-1a 64 over "medium\ngroup_idx\nhash" of every resident block. The router keeps its own sum
// as its index changes (add when a block becomes resident, subtract when it leaves: O(1) per
// change) and compares it with the gateway's `digest` messages: a difference means its view has
// drifted, and it starts over from a fresh snapshot.

import (
	"fmt"
	"strconv"
)

const (
	fnvOffset uint64 = 0xcbf29ce484222325
	fnvPrime  uint64 = 0x100000001b3
)

// Element is one block's share of the digest (uint64 arithmetic wraps: modulo 2^64).
func Element(k BlockKey) uint64 {
	h := fnvOffset
	for _, b := range []byte(k.Medium + "\n" + strconv.Itoa(k.Group) + "\n" + k.Hash) {
		h ^= uint64(b)
		h *= fnvPrime
	}
	return h
}

// HexDigest writes a digest as the gateway does: 16 lowercase hex digits.
func HexDigest(sum uint64) string { return fmt.Sprintf("%016x", sum) }

// addRefs adds n references to a block; its element joins the sum when it becomes resident.
func (s *Stream) addRefs(k BlockKey, n int) {
	if s.Blocks[k] == 0 {
		s.Sum += Element(k)
	}
	s.Blocks[k] += n
}

// takeRef takes one reference; the element leaves the sum with the last one. A block not held
// is a normal unknown remove.
func (s *Stream) takeRef(k BlockKey) {
	n, held := s.Blocks[k]
	switch {
	case !held:
	case n > 1:
		s.Blocks[k] = n - 1
	default:
		delete(s.Blocks, k)
		s.Sum -= Element(k)
	}
}

// empty drops every block (a clear, a restart).
func (s *Stream) empty() {
	s.Blocks = map[BlockKey]int{}
	s.Sum = 0
}

// DigestChecks counts the gateway's digest messages compared with the router's own sums.
type DigestChecks struct {
	Checks       int `json:"digest_checks"`
	Mismatches   int `json:"digest_mismatches"`
	LastMismatch int `json:"last_mismatch_check"` // the number of the check that found the last one
}

// Check compares a `digest` message with the stream's own sum and block count; false on a mismatch.
func (ix *Index) Check(m *Message, counts *DigestChecks) bool {
	s := ix.stream(StreamKey{m.Source, m.DPRank})
	counts.Checks++
	if HexDigest(s.Sum) == m.Digest && len(s.Blocks) == m.BlockCount {
		return true
	}
	counts.Mismatches++
	counts.LastMismatch = counts.Checks
	return false
}

// DropOne removes one block from the index, as a missed event would (a test's deliberate drift):
// the first of the first stream in sorted order that has one; "" when there is none.
func (ix *Index) DropOne() string {
	doc := ix.Document()
	for _, s := range doc["streams"].([]DocStream) {
		if len(s.Blocks) > 0 {
			b := s.Blocks[0]
			ix.stream(StreamKey{s.Source, s.DPRank}).takeRefs(BlockKey{b.Medium, b.GroupIdx, b.Hash})
			return fmt.Sprintf("%s:%d %s/%d/%s", s.Source, s.DPRank, b.Medium, b.GroupIdx, b.Hash)
		}
	}
	return ""
}

// takeRefs removes a block whatever its reference count.
func (s *Stream) takeRefs(k BlockKey) {
	for s.Blocks[k] > 0 {
		s.takeRef(k)
	}
}
