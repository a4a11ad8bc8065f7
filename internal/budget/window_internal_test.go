package budget

import (
	"bytes"
	"encoding/json"
	"testing"
)

// storedForm is what Window.MarshalJSON writes, as encoding/json writes
// it: vectors without their trailing zeros (at least requests and tokens;
// a placement's units only when one is set), empty parts left out.
type storedForm struct {
	S    map[string][]int64 `json:"s"`
	P    []plannedJSON      `json:"p,omitempty"`
	TAT  []int64            `json:"tat,omitempty"`
	Last int64              `json:"last,omitempty"`
	E    map[string]int64   `json:"e,omitempty"`
}

// canonical is data decoded and encoded again by encoding/json: object
// keys sorted, numbers as written.
func canonical(t *testing.T, data []byte) []byte {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Window.MarshalJSON, written by hand because it runs at every
// compare-and-set, writes what encoding/json writes for the stored form:
// the same bytes where no map has two entries (their order is the map's),
// the same JSON where they do.
func TestWindowMarshalIsEncodingJSON(t *testing.T) {
	t.Parallel()
	out := dims - 1 // the output entry, last
	withOutput := func(v Vec, n int64) Vec { v[out] = n; return v }
	for _, tc := range []struct {
		name  string
		w     Window
		want  storedForm
		exact bool
	}{
		{name: "empty", w: Window{}, want: storedForm{S: map[string][]int64{}}, exact: true},
		{name: "one of each", exact: true,
			w: Window{Slices: map[int64]Vec{7: {1, 5000}}, P: []planned{{At: 100, V: Vec{1, 20, 3}}},
				TAT: Vec{150, 250}, Last: 100, Ends: map[int64]int64{7: 120}},
			want: storedForm{S: map[string][]int64{"7": {1, 5000}}, P: []plannedJSON{{At: 100, R: 1, T: 20, U: []int64{3}}},
				TAT: []int64{150, 250}, Last: 100, E: map[string]int64{"7": 120}}},
		{name: "several of each",
			w: Window{
				Slices: map[int64]Vec{7: {1, 5000}, 8: {2}, 9: {1, 10, 0, 3}, 10: withOutput(Vec{}, 42), -3: {}},
				P: []planned{{At: 100, V: Vec{1, 20}}, {At: 200, V: Vec{1, 30, 5}}, {At: 300, V: withOutput(Vec{1}, 7)},
					{At: 400, V: Vec{0, 0, 0, 0, 9}}},
				TAT:  Vec{150, 250, 0, 4},
				Last: 400,
				Ends: map[int64]int64{7: 120, 8: 249, 9: 0, 1 << 40: -1},
			},
			want: storedForm{
				S: map[string][]int64{"7": {1, 5000}, "8": {2, 0}, "9": {1, 10, 0, 3}, "10": append(make([]int64, out), 42), "-3": {0, 0}},
				P: []plannedJSON{{At: 100, R: 1, T: 20}, {At: 200, R: 1, T: 30, U: []int64{5}},
					{At: 300, R: 1, U: append(make([]int64, out-2), 7)}, {At: 400, U: []int64{0, 0, 9}}},
				TAT:  []int64{150, 250, 0, 4},
				Last: 400,
				E:    map[string]int64{"7": 120, "8": 249, "9": 0, "1099511627776": -1},
			},
		},
	} {
		got, err := tc.w.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want, err := json.Marshal(tc.want)
		if err != nil {
			t.Fatal(err)
		}
		if tc.exact && !bytes.Equal(got, want) {
			t.Errorf("%s: MarshalJSON wrote\n%s\nencoding/json writes\n%s", tc.name, got, want)
		}
		if !bytes.Equal(canonical(t, got), canonical(t, want)) {
			t.Errorf("%s: MarshalJSON wrote\n%s\nencoding/json writes (but for the order of keys)\n%s", tc.name, got, want)
		}
	}
}
