package budget

import (
	"encoding/json"
	"reflect"
	"testing"
)

// decodeWindowStd is UnmarshalJSON with encoding/json, as it was.
func decodeWindowStd(data []byte) (Window, error) {
	w := Window{Slices: map[int64]Vec{}}
	var raw windowJSON
	if err := json.Unmarshal(data, &raw); err != nil {
		return w, err
	}
	return w, w.fromJSON(raw)
}

func windowDecodeSeeds() []string {
	full := Window{Slices: map[int64]Vec{7: {1, 200}, 8: {2, 0, 3}}, P: []planned{{At: 5, V: Vec{1, 10, 0, 4}}}, TAT: Vec{9, 8}, Last: 3, Ends: map[int64]int64{7: 12}}
	b, _ := full.MarshalJSON()
	return []string{
		string(b), `{}`, `null`, `{"s":{}}`, `{"s":{"1":[1]}}`,
		`{"s":{"1":[1,2,3,4,5,6,7,8,9]}}`, // longer than a Vec: the tail is lost
		`{"s":{"x":[1]}}`, `{"e":{"x":1}}`, `{"s":{"1":[1.5]}}`, `{"s":{"1":["1"]}}`,
		`{"p":[{"a":1,"r":2,"t":3,"u":[4,5,6,7,8]}]}`, `{"tat":[1,2],"last":-4}`,
		`{"S":{"1":[1]},"TAT":[3]}`, `{"s":{"1":[1]},"s":{"2":[2]}}`, `{"s":{"1":[1]}} x`,
		`{"s":{"1":[1]}}{}`, `[1]`, `"x"`, `{"last":1e3}`, `{"last":9223372036854775808}`, `{"unknown":1}`,
	}
}

// TestWindowDecodesAsStd: a stored window decodes to what encoding/json
// made of it, and what it refuses, encoding/json refused. (Windows are
// written by Sluice, not a trust boundary, so no fuzz target runs in CI;
// one ran 290k inputs by hand when the decoder changed.)
func TestWindowDecodesAsStd(t *testing.T) {
	t.Parallel()
	for _, s := range windowDecodeSeeds() {
		windowDecodesAsStd(t, []byte(s))
	}
}

func windowDecodesAsStd(t *testing.T, data []byte) {
	t.Helper()
	want, wantErr := decodeWindowStd(data)
	got := Window{Slices: map[int64]Vec{}}
	err := got.UnmarshalJSON(data)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("%q: error %v, encoding/json's %v", data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: decoded %+v, encoding/json %+v", data, got, want)
	}
}

// BenchmarkWindowDecode: a paced window of a busy model (240 slices, 64
// planned instants), decoded as the store reads it, and with encoding/json.
func BenchmarkWindowDecode(b *testing.B) {
	w := Window{Slices: map[int64]Vec{}, Ends: map[int64]int64{}}
	for i := range int64(240) {
		w.Slices[1_000_000+i] = Vec{i % 7, 5000 + i}
		w.Ends[1_000_000+i] = 2_000_000 + i
	}
	for i := range int64(64) {
		w.P = append(w.P, planned{At: 3_000_000 + i, V: Vec{1, 4000 + i}})
	}
	data, _ := w.MarshalJSON()
	b.Run("v1", func(b *testing.B) {
		for b.Loop() {
			var got Window
			if err := got.UnmarshalJSON(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeWindowStd(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
