package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"

	"github.com/kvindex/kvindex/blockkeys"
	"github.com/kvindex/kvindex/kvevents/event"
	"github.com/prometheus/client_golang/prometheus"
)

// decodeCounters are the per-engine decode series, resolved once so the
// per-message path does no label lookups.
type decodeCounters struct {
	events  [blockkeys.NumEngines][4]prometheus.Counter // [engine][kind]
	batches [blockkeys.NumEngines]prometheus.Counter
	evErrs  [blockkeys.NumEngines]prometheus.Counter
	bErrs   [blockkeys.NumEngines]prometheus.Counter
}

func newDecodeCounters(m *Metrics) decodeCounters {
	var c decodeCounters
	for e := 0; e < int(blockkeys.NumEngines); e++ {
		eng := blockkeys.Engine(e).String()
		for k := event.BlockStored; k <= event.AllBlocksCleared; k++ {
			c.events[e][k] = m.EventsDecoded.WithLabelValues(eng, k.String())
		}
		c.batches[e] = m.BatchesDecoded.WithLabelValues(eng)
		c.evErrs[e] = m.DecodeErrors.WithLabelValues(eng, "event")
		c.bErrs[e] = m.DecodeErrors.WithLabelValues(eng, "batch")
	}
	return c
}

func (s *Subscriber) drop(reason string) {
	s.metrics.DroppedFrames.WithLabelValues(reason).Inc()
}

// SGLang publishers with a snapshot endpoint append metadata to the topic
// frame: "\x00sgl-kv-epoch=<id>" on every batch and, on the empty batch that
// marks a snapshot cut, "\x00sgl-kv-snapshot=<barrier id>" after it.
var (
	epochMarker   = []byte("\x00sgl-kv-epoch=")
	barrierMarker = []byte("\x00sgl-kv-snapshot=")
)

// splitTopicMeta separates a topic from SGLang's metadata suffix. Anything
// after a NUL is metadata, never part of the pod or model name.
func splitTopicMeta(topic []byte) (base, epoch, barrier []byte) {
	i := bytes.IndexByte(topic, 0)
	if i < 0 {
		return topic, nil, nil
	}
	base, meta := topic[:i], topic[i:]
	if bytes.HasPrefix(meta, epochMarker) {
		epoch = meta[len(epochMarker):]
		if j := bytes.Index(epoch, barrierMarker); j >= 0 {
			epoch, barrier = epoch[:j], epoch[j+len(barrierMarker):]
		}
	}
	return base, epoch, barrier
}

// parseTopic splits kv@<pod>@<model>: pod is between the first and second
// '@', model is everything after the second (model names may contain '@').
// SGLang's metadata suffix (splitTopicMeta) is not part of either.
func parseTopic(topic []byte) (pod, model []byte) {
	topic, _, _ = splitTopicMeta(topic)
	i := bytes.IndexByte(topic, '@')
	if i < 0 {
		return nil, nil
	}
	rest := topic[i+1:]
	j := bytes.IndexByte(rest, '@')
	if j < 0 {
		return rest, nil
	}
	return rest[:j], rest[j+1:]
}

// handle turns one live message [topic, seq, payload] into a batch and
// passes it to its stream; useful says it was a batch with events that was
// admitted (what earns a bound connection its slot).
func (s *Subscriber) handle(ctx context.Context, src *source, frames [][]byte) (useful bool) {
	if src.msgs != nil { // nil for a view: its hub counts the message once
		src.msgs.Inc()
	}
	if len(frames) != 3 {
		s.drop("frame_count")
		return false
	}
	if len(frames[1]) != 8 {
		s.drop("seq_length")
		return false
	}
	topic := frames[0]
	if !s.topicAllowed(src, topic) {
		s.drop("topic_filter")
		return false
	}
	podB, modelB := parseTopic(topic)
	_, epoch, _ := splitTopicMeta(topic)
	pod, model := src.pod, src.model
	if pod == "" {
		pod = string(podB)
	}
	if model == "" {
		model = string(modelB)
	}
	if pod == "" {
		s.drop("no_pod")
		return false
	}
	if why := checkName(podB, MaxPodNameBytes); why != "" && src.pod == "" {
		s.drop("pod_name_" + why)
		s.warn(src.addr, "dropping KV events: pod name in topic rejected", "endpoint", src.addr, "reason", why, "pod", printable(podB))
		return false
	}
	if why := checkName(modelB, MaxModelNameBytes); why != "" && src.model == "" {
		s.drop("model_name_" + why)
		s.warn(src.addr+"|"+pod, "dropping KV events: model name in topic rejected", "endpoint", src.addr, "pod", pod,
			"reason", why, "model", printable(modelB))
		return false
	}
	b := &event.Batch{Pod: pod, Model: model, Engine: src.engine, Seq: binary.BigEndian.Uint64(frames[1])}
	ok, evErrs := s.decode(frames[2], b, src)
	if !ok {
		return false
	}
	st := s.admitBatch(src, b)
	if st == nil {
		return false
	}
	// Counted before sequence, which may hand b on.
	useful = len(b.Events) > 0
	s.sequence(ctx, st, src, b, evErrs, epoch, fromLive)
	return useful
}

// decode decodes payload into b and counts the outcome; it reports whether
// b is usable and how many of its events were dropped.
func (s *Subscriber) decode(payload []byte, b *event.Batch, src *source) (bool, int) {
	// Endpoints are validated (Engine.Valid), so e indexes the tables.
	e := b.Engine
	ds, err := Decode(payload, b.Engine, b)
	if err != nil {
		s.counts.bErrs[e].Inc()
		if errors.Is(err, ErrTooManyElements) {
			s.drop("too_many_elements")
		}
		s.warn(src.addr+"|"+b.Pod, "dropping malformed KV event message", "pod", b.Pod, "seq", b.Seq, "endpoint", src.addr, "err", err)
		return false, 0
	}
	if !ds.HasDPRank {
		b.DPRank = src.dpRank // the endpoint's declared rank (0 unless set)
	}
	s.counts.batches[e].Inc()
	for i := range b.Events {
		if k := b.Events[i].Kind; k <= event.AllBlocksCleared {
			s.counts.events[e][k].Inc()
		}
	}
	if ds.IgnoredFields > 0 {
		s.metrics.IgnoredFields.WithLabelValues(b.Engine.String()).Add(float64(ds.IgnoredFields))
		s.log.Debug("optional KV event fields not interpreted; events kept", "pod", b.Pod, "seq", b.Seq,
			"fields", ds.IgnoredFields, "first", ds.FirstIgnored)
	}
	if ds.UnknownMedia > 0 {
		s.metrics.UnknownMedia.Add(float64(ds.UnknownMedia))
	}
	if ds.PackedEvents > 0 {
		s.metrics.PackedEvents.Add(float64(ds.PackedEvents))
	}
	if ds.EventErrors > 0 {
		s.counts.evErrs[e].Add(float64(ds.EventErrors))
		s.warn(src.addr+"|"+b.Pod, "dropped malformed KV events", "pod", b.Pod, "dp_rank", b.DPRank, "seq", b.Seq,
			"dropped", ds.EventErrors, "first", ds.FirstEventError)
	}
	return true, ds.EventErrors
}
