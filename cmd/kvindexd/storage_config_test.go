package main

import (
	"io"
	"reflect"
	"testing"
)

// --storage-readers names the sources (none by default, issue 35): '*' is every pod of
// the model, a list names pods, nothing names none.
func TestParseStorageReaders(t *testing.T) {
	got, err := parseStorageReaders("SHARED_STORAGE=pod-a, pod-b; NAS=*; OBJECT_STORE=")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"SHARED_STORAGE": {"pod-a", "pod-b"}, "NAS": nil, "OBJECT_STORE": {}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v", got)
	}
	if def, _ := parseStorageReaders(DefaultConfig().StorageReaders); len(def) != 0 {
		t.Fatalf("default %#v", def)
	}
	for _, bad := range []string{"SHARED_STORAGE", "=pod-a", "S=a,*"} {
		if _, err := parseStorageReaders(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
		if _, err := loadConfig([]string{"--storage-readers", bad}, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("--storage-readers %q accepted", bad)
		}
	}
}

// --max-sessions-per-pod 0 turns sessions off (the applier's 0 is its default).
func TestMaxSessionsPerPodOff(t *testing.T) {
	cfg, err := loadConfig([]string{"--max-sessions-per-pod", "0"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if n := cfg.LimitsConfig.applier(true).SessionsPerPod; n >= 0 {
		t.Fatalf("SessionsPerPod %d", n)
	}
	if _, err := loadConfig([]string{"--max-sessions-per-pod", "-1"}, func(string) string { return "" }, io.Discard); err == nil {
		t.Fatal("negative accepted")
	}
}
