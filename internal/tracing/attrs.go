package tracing

import "go.opentelemetry.io/otel/attribute"

// Span names. The request spans follow the semantic conventions (HTTP:
// "{method} {route}", gRPC: "{service}/{method}"); the stage spans are the
// daemon's own.
const (
	SpanRender   = "kvindex.chat.render"
	SpanTokenize = "kvindex.tokenize"
	SpanKeys     = "kvindex.keys"
	SpanLookup   = "kvindex.index.lookup"
	SpanPick     = "kvindex.pick"
	SpanApply    = "kvindex.events.apply"
)

// Attribute keys. Semantic-convention names where one exists; the
// daemon's own under kvindex.*. None of them carries request content.
const (
	// OpenTelemetry semantic conventions.
	HTTPMethod     = attribute.Key("http.request.method")
	HTTPRoute      = attribute.Key("http.route")
	HTTPStatus     = attribute.Key("http.response.status_code")
	RPCSystem      = attribute.Key("rpc.system")
	RPCService     = attribute.Key("rpc.service")
	RPCMethod      = attribute.Key("rpc.method")
	RPCGRPCStatus  = attribute.Key("rpc.grpc.status_code")
	ErrorType      = attribute.Key("error.type")
	GenAIModel     = attribute.Key("gen_ai.request.model")
	DBSystem       = attribute.Key("db.system.name")
	DBOperation    = attribute.Key("db.operation.name")
	DBBatchSize    = attribute.Key("db.operation.batch.size")
	ServerAddress  = attribute.Key("server.address")
	ServerPort     = attribute.Key("server.port")
	ServiceVersion = attribute.Key("service.version")

	// The daemon's own.
	InputKind      = attribute.Key("kvindex.input.kind")
	Tokens         = attribute.Key("kvindex.tokens")
	ReusedTokens   = attribute.Key("kvindex.tokenize.reused_tokens")
	PrefixStoreHit = attribute.Key("kvindex.tokenize.prefix_store_hit")
	Blocks         = attribute.Key("kvindex.blocks")
	KeyCacheHits   = attribute.Key("kvindex.key_cache.hits")
	PodsMatched    = attribute.Key("kvindex.lookup.pods_matched")
	BestBlocks     = attribute.Key("kvindex.lookup.best_matched_blocks")
	PickPolicy     = attribute.Key("kvindex.pick.policy")
	PickReason     = attribute.Key("kvindex.pick.reason")
	PickPod        = attribute.Key("kvindex.pick.pod")
	PickDPRank     = attribute.Key("kvindex.pick.dp_rank")
	PickCandidates = attribute.Key("kvindex.pick.candidates")
	PickMatched    = attribute.Key("kvindex.pick.matched_blocks")
	PickSplit      = attribute.Key("kvindex.pick.disaggregation")
	PickPrefillPod = attribute.Key("kvindex.pick.prefill_pod")
	PickKVSource   = attribute.Key("kvindex.pick.kv_source")
	Pod            = attribute.Key("kvindex.pod")
	DPRank         = attribute.Key("kvindex.dp_rank")
	EventSeq       = attribute.Key("kvindex.events.seq")
	EventCount     = attribute.Key("kvindex.events.count")
	BlocksStored   = attribute.Key("kvindex.blocks.stored")
	BlocksRemoved  = attribute.Key("kvindex.blocks.removed")
	ApplyOutcome   = attribute.Key("kvindex.events.outcome")
)
