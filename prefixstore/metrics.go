package prefixstore

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the prefix store's Prometheus metrics.
type Metrics struct {
	latency          prometheus.Histogram
	tokensPerRequest prometheus.Histogram
	tokens           prometheus.Counter
	reusedTokens     prometheus.Counter
	hits, misses     prometheus.Counter
	errors           prometheus.Counter
	cancelled        prometheus.Counter
	refused          *prometheus.CounterVec
	inflightBytes    prometheus.Gauge
	evictions        prometheus.Counter
	inconsistent     prometheus.Counter
	chunks           prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil = unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindexd_prompt_tokenize_seconds",
			Help:    "Time to tokenize a prompt through the prefix store (incl. first-use tokenizer load).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2.5, 14), // 10us .. ~1.5s
		}),
		tokensPerRequest: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvindexd_prompt_tokens",
			Help:    "Tokens per tokenized prompt.",
			Buckets: prometheus.ExponentialBuckets(16, 2, 14), // 16 .. 131072
		}),
		tokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prompt_tokens_total", Help: "Tokens produced for prompts."}),
		reusedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prefixstore_reused_tokens_total", Help: "Prompt tokens taken from the prefix store instead of tokenized."}),
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prefixstore_hits_total", Help: "Prompts that reused cached prefix tokens."}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prefixstore_misses_total", Help: "Prompts tokenized in full."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prompt_tokenize_errors_total", Help: "Prompt tokenization failures (unknown model, load or encode error)."}),
		cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prompt_tokenize_cancelled_total", Help: "Prompt tokenizations stopped part-way because their request ended (client gone or deadline passed)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvindexd_prompt_tokenize_refused_total",
			Help: "Prompts refused before tokenization: too_long (above --max-prompt-bytes), busy (no room in --tokenize-max-inflight-bytes in time), too_many_tokens (tokenization stopped once the ids passed the 1,048,576-token limit)."}, []string{"reason"}),
		inflightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindexd_prompt_tokenize_inflight_bytes", Help: "Bytes of the prompts being tokenized now."}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prefixstore_evictions_total", Help: "Chunks evicted (LRU) from the prefix store."}),
		inconsistent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvindexd_prefixstore_inconsistent_total", Help: "Cached chains discarded by an internal consistency check (should stay 0)."}),
		chunks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvindexd_prefixstore_chunks", Help: "Chunks cached in the prefix store, all models."}),
	}
	for _, r := range []string{"too_long", "busy", "too_many_tokens"} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.latency, m.tokensPerRequest, m.tokens, m.reusedTokens, m.hits, m.misses,
			m.errors, m.cancelled, m.refused, m.inflightBytes, m.evictions, m.inconsistent, m.chunks)
	}
	return m
}
