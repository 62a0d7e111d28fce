// Package mirror holds a minimal mirror of the llm-d-router endpoint-picker
// framework types that a data producer touches. The llm-d modules are not
// served by the Go module proxy this project builds from, so the producer in
// examples/llmd-producer compiles against these packages instead; with the
// real module, replace the import paths and the producer's method set is
// unchanged.
//
// Mirrored from github.com/llm-d/llm-d-router at commit
// ebab687927f5331c1b39defcb579a07951bce56c (2026-08-22), one package per
// upstream package, with only the declarations the producer and its test use:
//
//	mirror/plugin          pkg/epp/framework/interface/plugin (plugins.go, datakey.go, typedname.go, registry.go, handle.go)
//	mirror/datalayer       pkg/epp/framework/interface/datalayer (attributemap.go, endpoint_metadata.go, metrics.go)
//	mirror/requesthandling pkg/epp/framework/interface/requesthandling (types.go: InferenceRequestBody, TokenizedRequest)
//	mirror/scheduling      pkg/epp/framework/interface/scheduling (types.go)
//	mirror/requestcontrol  pkg/epp/framework/interface/requestcontrol (plugins.go: DataProducer, PreRequest)
//	mirror/prefix          pkg/epp/framework/plugins/datalayer/attribute/prefix (data_types.go)
//	mirror/tokenizer       pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer (TokenizedPromptDataKey)
//
// Deliberate simplifications: datalayer.ID is a local struct instead of
// k8s.io/apimachinery's types.NamespacedName (same fields); the plugin
// Handle keeps only Context; request bodies keep only the tokenized prompt.
package mirror
