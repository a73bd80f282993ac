package agentapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// The connection listing streams: the agent writes each end as the
// datapath's listing hands it over, and the asker decodes and prints each
// as it comes, so a listing of millions of ends holds little memory on
// either side and its deadline is IdleTimeout between bytes, not a total.
// The body is datapath.Listing's JSON with "connections" first, and an
// "error" after the ends when the listing failed part-way (an error before
// the first end is a 500, as the other routes answer).

// flushEvery is how long the agent lets written ends wait in its buffers.
const flushEvery = time.Second

// listingTail is what follows the ends: the listing's other fields, and
// the error that ended it part-way.
type listingTail struct {
	datapath.Listing
	// Conns hides Listing's (the ends came before).
	Conns *struct{} `json:"connections,omitempty"`
	Error string    `json:"error,omitempty"`
}

// streamConnections answers GET ConnectionsPath from list.
func streamConnections(w http.ResponseWriter, r *http.Request, list func(context.Context, func(datapath.Connection) error) (datapath.Listing, error)) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 64<<10)
	n, last := 0, time.Now()
	begin := func() {
		w.Header().Set("Content-Type", "application/json")
		bw.WriteString("{\"connections\":[\n")
	}
	emit := func(c datapath.Connection) error {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("the asker went away: %w", err)
		}
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if n == 0 {
			begin()
		} else {
			bw.WriteString(",\n")
		}
		n++
		if _, err := bw.Write(b); err != nil {
			return fmt.Errorf("the asker went away: %w", err)
		}
		if time.Since(last) < flushEvery {
			return nil
		}
		last = time.Now()
		if err := bw.Flush(); err != nil {
			return fmt.Errorf("the asker went away: %w", err)
		}
		return rc.Flush()
	}
	l, err := list(ctx, emit)
	if n == 0 {
		if err != nil {
			reply(w, nil, err)
			return
		}
		begin()
	}
	t := listingTail{Listing: l}
	if err != nil {
		t.Error = err.Error()
	}
	b, _ := json.Marshal(t)
	bw.WriteString("\n],")
	bw.Write(b[1:]) // the object's fields and its closing brace
	bw.WriteString("\n")
	bw.Flush()
}

// Connections asks the agent at the socket path for its connection listing
// and hands each end to emit as it arrives; it returns the listing's other
// fields (no Conns). ErrNoAgent when nothing listens there; an error when
// the agent sends nothing for IdleTimeout, when its listing failed
// part-way, and at emit's first error.
func Connections(ctx context.Context, path string, emit func(datapath.Connection) error) (datapath.Listing, error) {
	resp, err := ask(ctx, path, ConnectionsPath)
	if err != nil {
		return datapath.Listing{}, err
	}
	defer resp.Body.Close()
	t, err := decodeListing(json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10)), emit)
	if err != nil {
		return t.Listing, fmt.Errorf("the agent at %s: %s: %w", path, ConnectionsPath, idleErr(err))
	}
	if t.Error != "" {
		return t.Listing, fmt.Errorf("the agent at %s: the listing failed part-way: %s", path, t.Error)
	}
	return t.Listing, nil
}

// decodeListing decodes a listing's object, handing each end of its
// "connections" to emit and the other fields to the tail.
func decodeListing(dec *json.Decoder, emit func(datapath.Connection) error) (listingTail, error) {
	var t listingTail
	rest := map[string]json.RawMessage{}
	if err := expect(dec, json.Delim('{')); err != nil {
		return t, err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return t, err
		}
		key, _ := tok.(string)
		if key != "connections" {
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				return t, err
			}
			rest[key] = v
			continue
		}
		if err := decodeEnds(dec, emit); err != nil {
			return t, err
		}
	}
	if err := expect(dec, json.Delim('}')); err != nil {
		return t, err
	}
	b, _ := json.Marshal(rest)
	return t, json.Unmarshal(b, &t)
}

// decodeEnds decodes the array of ends (or null).
func decodeEnds(dec *json.Decoder, emit func(datapath.Connection) error) error {
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("connections: %v, want an array", tok)
	}
	for dec.More() {
		var c datapath.Connection
		if err := dec.Decode(&c); err != nil {
			return err
		}
		if err := emit(c); err != nil {
			return err
		}
	}
	return expect(dec, json.Delim(']'))
}

func expect(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("%v, want %v", tok, want)
	}
	return nil
}
