// Package tokenizer mirrors the data key of llm-d-router's token-producer
// (pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer,
// tokenizer.go) at ebab687927f5331c1b39defcb579a07951bce56c.
package tokenizer

import "github.com/kvindex/kvindex/examples/llmd-producer/mirror/plugin"

// PluginType is the token-producer's type name.
const PluginType = "token-producer"

// TokenizedPromptDataKey is what the token-producer publishes: the request
// body's TokenizedRequest.
var TokenizedPromptDataKey = plugin.NewDataKey("TokenizedPrompt", PluginType)
