package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvindex/kvindex/applier"
	"github.com/kvindex/kvindex/kvevents"
	"github.com/kvindex/kvindex/kvevents/zmtp"
)

func TestLimitsConfig(t *testing.T) {
	env := map[string]string{"KVINDEX_ZMQ_MAX_MESSAGE_SIZE": "1048576", "KVINDEX_ZMQ_HANDSHAKE_TIMEOUT": "2s",
		"KVINDEX_POD_EXPIRY": "0"}
	cfg, err := loadConfig([]string{"--zmq-max-conns", "10", "--max-streams", "50", "--pod-share", "0"},
		func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var sc kvevents.Config
	cfg.LimitsConfig.subscriber(&sc)
	if sc.Transport.MaxMessageSize != 1<<20 || sc.Transport.HandshakeTimeout != 2*time.Second || sc.Transport.MaxConns != 10 ||
		sc.MaxStreams != 50 || sc.MaxModels != kvevents.DefaultMaxModels || sc.PodExpiry >= 0 {
		t.Fatalf("subscriber config %+v", sc)
	}
	if a := cfg.LimitsConfig.applier(true); a != (applier.Limits{MaxDigestCaches: applier.DefaultMaxDigestCaches,
		MaxAliasTables: applier.DefaultMaxAliasTables, SessionsPerPod: applier.DefaultSessionsPerPod, MaxSessions: applier.DefaultMaxSessions}) {
		t.Fatalf("applier limits %+v", a)
	}
	def, err := loadConfig(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	def.LimitsConfig.subscriber(&sc)
	if sc.Transport.MaxMessageSize != zmtp.DefaultMaxMessageSize || sc.PodExpiry != time.Hour ||
		def.LimitsConfig.applier(true).PodShare != applier.DefaultPodShare || def.LimitsConfig.applier(false).PodShare != 0 ||
		def.LimitsConfig.applier(true).SessionsPerPod != applier.DefaultSessionsPerPod {
		t.Fatalf("defaults %+v %+v", sc, def.LimitsConfig)
	}
	for _, ext := range []string{".yaml", ".json"} {
		file := filepath.Join(t.TempDir(), "c"+ext)
		if err := os.WriteFile(file, []byte(`{"max_models": 7, "pod_expiry": "5m"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := loadConfig([]string{"--config", file}, func(string) string { return "" }, io.Discard)
		if err != nil || c.MaxModels != 7 || c.PodExpiry != Duration(5*time.Minute) {
			t.Fatalf("%s config file: %v %+v", ext, err, c.LimitsConfig)
		}
	}
	for _, bad := range [][]string{{"--zmq-handshake-timeout", "0s"}, {"--pod-expiry", "-1s"}, {"--max-streams", "0"},
		{"--zmq-max-message-size", "-1"}, {"--pod-share", "-2"}, {"--max-alias-tables", "0"}} {
		if _, err := loadConfig(bad, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
