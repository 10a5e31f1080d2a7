// Command router is an example KV-cache-aware router's view of a kvgateway fleet.
//
// It connects to the gateway's WebSocket with snapshot=blocks, builds its own index of every
// stream's resident blocks from the `state` messages and then the live batches and notices,
// reconnects with its last id (a resumed connection keeps the index; a fresh one starts over from
// a new snapshot), checks its index against the gateway's state digest every -digest seconds
// (a mismatch is counted, and the router starts over from a fresh snapshot), and answers
// longest-prefix queries over HTTP:
//
//	router -gateway http://127.0.0.1:8080 -listen 127.0.0.1:9090 [-source a] [-dp-rank 0] [-digest 30]
//	curl -d '{"block_hashes": ["123", "456"]}' http://127.0.0.1:9090/lookup   # as POST /v1/lookup
//	curl http://127.0.0.1:9090/blocks                                        # as GET /v1/blocks
//
// Standard library plus github.com/gorilla/websocket only. See ../README.md for the offline build.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// Router is the index, the resume position and the connection's snapshot progress.
type Router struct {
	mu      sync.Mutex
	index   *Index
	lastID  string // what to resume from: only ids whose state the index fully holds
	pending string // the hello's id while its snapshot is still arriving
	waiting map[StreamKey]bool
	sources map[string]bool
	ranks   map[int]bool
	ready   bool
	digests DigestChecks
	// every is the digest interval asked for (0: none); resync: a mismatch ends the connection
	// and the next one starts from a fresh snapshot (the live router; the offline replay only counts).
	every     int
	resync    bool
	testHooks bool // POST /corrupt drops one block of the index (tests: a drift the digest must catch)
}

// errDrifted ends a connection whose index no longer matches the gateway's digest.
var errDrifted = errors.New("the index differs from the gateway's state digest: starting over from a fresh snapshot")

// NewRouter makes a router following the given filters (empty: everything).
func NewRouter(sources []string, ranks []int) *Router {
	r := &Router{index: NewIndex(), sources: map[string]bool{}, ranks: map[int]bool{}}
	for _, s := range sources {
		r.sources[s] = true
	}
	for _, d := range ranks {
		r.ranks[d] = true
	}
	return r
}

func (r *Router) matches(k StreamKey) bool {
	return (len(r.sources) == 0 || r.sources[k.Source]) && (len(r.ranks) == 0 || r.ranks[k.DPRank])
}

// finishSnapshot makes the hello's id the resume point: the index now holds its whole state.
func (r *Router) finishSnapshot() {
	if r.pending != "" {
		r.lastID = r.pending
		r.pending = ""
		r.waiting = nil
	}
	r.ready = true
}

// Handle applies one line of a WebSocket frame.
func (r *Router) Handle(line []byte) error {
	var m Message
	if err := json.Unmarshal(line, &m); err != nil {
		return fmt.Errorf("bad message: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch m.Type {
	case "hello":
		r.index.Hello(&m)
		id := m.Epoch + ":" + strconv.FormatInt(m.Offset, 10)
		if m.Recovered {
			r.lastID, r.pending, r.waiting = id, "", nil
			r.ready = true
			return nil
		}
		// Not recovered: state messages follow. Until every matching stream's last chunk (or the
		// first live message) has arrived, a reconnection must not resume from this hello: the
		// index would stay partial. Keep the previous id (another epoch's, or none): it cannot be
		// recovered either, so the next connection gets a fresh snapshot.
		r.pending = id
		r.ready = false
		r.waiting = map[StreamKey]bool{}
		for _, s := range m.Sources {
			k := StreamKey{s.Source, s.DPRank}
			if r.matches(k) {
				r.waiting[k] = true
			}
		}
		if len(r.waiting) == 0 {
			r.finishSnapshot()
		}
	case "state":
		r.index.State(&m)
		if m.IsLast() && r.waiting != nil {
			delete(r.waiting, StreamKey{m.Source, m.DPRank})
			if len(r.waiting) == 0 {
				r.finishSnapshot()
			}
		}
	case "digest":
		if !r.index.Check(&m, &r.digests) {
			log.Printf("router: %s:%d digest %s at offset %d, ours %s", m.Source, m.DPRank, m.Digest, m.Offset,
				HexDigest(r.index.stream(StreamKey{m.Source, m.DPRank}).Sum))
			if r.resync {
				r.lastID, r.pending = "", "" // never resume into the drifted index
				r.ready = false              // and say so until the fresh snapshot is whole
				return errDrifted
			}
		}
	case "batch", "notice":
		if r.pending != "" {
			r.finishSnapshot() // live messages come only after the whole snapshot
		}
		if m.Type == "batch" {
			r.index.Batch(&m)
		} else {
			r.index.Notice(&m)
		}
		if m.ID != "" {
			r.lastID = m.ID
		}
	}
	return nil
}

// HandleFrame applies one WebSocket text frame: one or more messages separated by "\n".
func (r *Router) HandleFrame(frame []byte) error {
	for _, line := range strings.Split(string(frame), "\n") {
		if line == "" {
			continue
		}
		if err := r.Handle([]byte(line)); err != nil {
			return err
		}
	}
	return nil
}

func (r *Router) wsURL(base, token string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "http", "ws":
		u.Scheme = "ws"
	case "https", "wss":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("gateway URL must be http(s) or ws(s), got %q", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/ws"
	q := url.Values{}
	q.Set("snapshot", "blocks")
	if r.every > 0 {
		q.Set("digest", strconv.Itoa(r.every))
	}
	for s := range r.sources {
		q.Add("source", s)
	}
	for d := range r.ranks {
		q.Add("dp_rank", strconv.Itoa(d))
	}
	r.mu.Lock()
	if r.lastID != "" {
		q.Set("last_event_id", r.lastID)
	}
	r.mu.Unlock()
	if token != "" {
		q.Set("token", token)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Run keeps a connection to the gateway, reconnecting with backoff and the last id.
func (r *Router) Run(base, token string, stop <-chan struct{}) {
	backoff := 200 * time.Millisecond
	for {
		connected, err := r.connectOnce(base, token, stop)
		select {
		case <-stop:
			return
		default:
		}
		if connected {
			backoff = 200 * time.Millisecond // a connection that worked starts the backoff over
		}
		log.Printf("router: connection ended (%v); reconnecting in %v", err, backoff)
		time.Sleep(backoff)
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

func (r *Router) connectOnce(base, token string, stop <-chan struct{}) (bool, error) {
	target, err := r.wsURL(base, token)
	if err != nil {
		return false, err
	}
	conn, resp, err := websocket.DefaultDialer.Dial(target, nil)
	if err != nil {
		if resp != nil {
			return false, fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
		}
		return false, err
	}
	defer conn.Close()
	conn.SetReadLimit(64 << 20)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
			conn.Close()
		case <-done:
		}
	}()
	for {
		kind, frame, err := conn.ReadMessage()
		if err != nil {
			return true, err
		}
		if kind != websocket.TextMessage {
			continue
		}
		if err := r.HandleFrame(frame); err != nil {
			return true, err
		}
	}
}

type lookupBody struct {
	BlockHashes []string `json:"block_hashes"`
	GroupIdx    *int     `json:"group_idx"`
}

func (r *Router) serveHTTP(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case req.URL.Path == "/blocks" && req.Method == http.MethodGet:
		r.mu.Lock()
		doc := r.index.Document()
		doc["ready"] = r.ready
		doc["last_event_id"] = r.lastID
		doc["digest_checks"] = r.digests.Checks
		doc["digest_mismatches"] = r.digests.Mismatches
		doc["last_mismatch_check"] = r.digests.LastMismatch
		r.mu.Unlock()
		_ = json.NewEncoder(w).Encode(doc)
	case req.URL.Path == "/corrupt" && req.Method == http.MethodPost && r.testHooks:
		r.mu.Lock()
		dropped := r.index.DropOne()
		r.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]interface{}{"dropped": dropped})
	case req.URL.Path == "/lookup" && req.Method == http.MethodPost:
		var body lookupBody
		dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || body.BlockHashes == nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": "expected {\"block_hashes\": [...]}"})
			return
		}
		group := -1
		if body.GroupIdx != nil {
			group = *body.GroupIdx
		}
		r.mu.Lock()
		answer := r.index.Lookup(body.BlockHashes, group)
		r.mu.Unlock()
		_ = json.NewEncoder(w).Encode(answer)
	default:
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "GET /blocks or POST /lookup"})
	}
}

// replay applies gateway messages read line by line from in (no network) and writes one JSON line
// per query line, `{"type":"query","block_hashes":[...],"group_idx":null}` (the lookup answer), per
// `{"type":"dump"}` line (the index as GET /v1/blocks shows it) and per `{"type":"digests"}` line
// (the digest checks so far); `{"type":"corrupt"}` drops one block of the index. Used by the tests.
func replay(r *Router, in *bufio.Scanner, out *json.Encoder) error {
	for in.Scan() {
		line := in.Bytes()
		var probe struct {
			Type        string   `json:"type"`
			BlockHashes []string `json:"block_hashes"`
			GroupIdx    *int     `json:"group_idx"`
		}
		if err := json.Unmarshal(line, &probe); err != nil {
			return fmt.Errorf("bad line: %w", err)
		}
		switch probe.Type {
		case "query":
			group := -1
			if probe.GroupIdx != nil {
				group = *probe.GroupIdx
			}
			if err := out.Encode(r.index.Lookup(probe.BlockHashes, group)); err != nil {
				return err
			}
		case "dump":
			if err := out.Encode(r.index.Document()); err != nil {
				return err
			}
		case "digests":
			if err := out.Encode(r.digests); err != nil {
				return err
			}
		case "corrupt":
			r.index.DropOne()
		default:
			if err := r.Handle(line); err != nil {
				return err
			}
		}
	}
	return in.Err()
}

func main() {
	var sources multiFlag
	var ranks multiFlag
	gateway := flag.String("gateway", "http://127.0.0.1:8080", "the gateway's base URL")
	listen := flag.String("listen", "127.0.0.1:9090", "where to answer /lookup and /blocks")
	flag.Var(&sources, "source", "follow this source only (repeatable)")
	flag.Var(&ranks, "dp-rank", "follow this dp_rank only (repeatable)")
	replayMode := flag.Bool("replay", false, "read messages, queries and dumps from stdin instead (offline; see replay)")
	every := flag.Int("digest", 30, "check the index against the gateway's state digest every this many seconds (0: never)")
	testHooks := flag.Bool("test-hooks", false, "answer POST /corrupt (drops one block of the index: for tests)")
	flag.Parse()
	dpRanks := []int{}
	for _, v := range ranks {
		d, err := strconv.Atoi(v)
		if err != nil || d < 0 {
			log.Fatalf("-dp-rank: expected a non-negative integer, got %q", v)
		}
		dpRanks = append(dpRanks, d)
	}
	router := NewRouter(sources, dpRanks)
	if *every < 0 || *every > 3600 {
		log.Fatalf("-digest: expected 0 to 3600 seconds, got %d", *every)
	}
	router.every, router.testHooks = *every, *testHooks
	if *replayMode {
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 1<<20), 256<<20)
		if err := replay(router, in, json.NewEncoder(os.Stdout)); err != nil {
			log.Fatal(err)
		}
		return
	}
	router.resync = true
	stop := make(chan struct{})
	go router.Run(*gateway, os.Getenv("KVGATEWAY_TOKEN"), stop)
	server := &http.Server{Addr: *listen, Handler: http.HandlerFunc(router.serveHTTP), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("router: following %s, answering on http://%s", *gateway, *listen)
	if err := server.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
