package tokenization

import (
	"encoding/json"
	"fmt"
)

// template is the effect of a post-processor on a single sequence's ids when
// add_special_tokens is set: lead ids before it, trail ids after it.
type template struct {
	lead, trail []uint32
}

type postJSON struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

func parsePostProcessor(raw json.RawMessage) (template, error) {
	var t template
	if len(raw) == 0 || string(raw) == "null" {
		return t, nil
	}
	var j postJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return t, fmt.Errorf("post_processor: %w", err)
	}
	switch j.Type {
	case "ByteLevel":
		// only adjusts offsets; ids are unchanged
		return t, nil
	case "Sequence":
		// processors apply in order, each wrapping the previous result
		for _, r := range j.Processors {
			s, err := parsePostProcessor(r)
			if err != nil {
				return t, err
			}
			t.lead = append(append([]uint32(nil), s.lead...), t.lead...)
			t.trail = append(t.trail, s.trail...)
		}
		return t, nil
	case "TemplateProcessing":
		seen := false
		for _, item := range j.Single {
			var it struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(item, &it); err != nil {
				return t, fmt.Errorf("TemplateProcessing: %w", err)
			}
			switch {
			case it.Sequence != nil:
				if it.Sequence.ID != "A" || seen {
					return t, fmt.Errorf("TemplateProcessing: unsupported single template sequence %q", it.Sequence.ID)
				}
				seen = true
			case it.SpecialToken != nil:
				st, ok := j.SpecialTokens[it.SpecialToken.ID]
				if !ok {
					return t, fmt.Errorf("TemplateProcessing: special token %q not defined", it.SpecialToken.ID)
				}
				if seen {
					t.trail = append(t.trail, st.IDs...)
				} else {
					t.lead = append(t.lead, st.IDs...)
				}
			default:
				return t, fmt.Errorf("TemplateProcessing: unknown template item %s", item)
			}
		}
		if !seen {
			return t, fmt.Errorf("TemplateProcessing: single template has no $A")
		}
		return t, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPairID(j.Cls)
		if err != nil {
			return t, fmt.Errorf("%s cls: %w", j.Type, err)
		}
		sep, err := tokenPairID(j.Sep)
		if err != nil {
			return t, fmt.Errorf("%s sep: %w", j.Type, err)
		}
		t.lead, t.trail = []uint32{cls}, []uint32{sep}
		return t, nil
	}
	return t, fmt.Errorf("unsupported post_processor %q", j.Type)
}

// tokenPairID reads ["[CLS]", 101].
func tokenPairID(p []json.RawMessage) (uint32, error) {
	if len(p) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(p[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}

// tokenizerConfig holds the tokenizer_config.json fields that change ids.
type tokenizerConfig struct {
	TokenizerClass string          `json:"tokenizer_class"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`
	BOS            json.RawMessage `json:"bos_token"`
	EOS            json.RawMessage `json:"eos_token"`
	// SplitSpecialTokens: transformers sets the Rust tokenizer's
	// encode_special_tokens from it, so special tokens in the text are
	// encoded as plain text.
	SplitSpecialTokens bool `json:"split_special_tokens"`
}

func splitSpecialTokens(raw []byte) (bool, error) {
	if len(raw) == 0 {
		return false, nil
	}
	var c tokenizerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return false, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	return c.SplitSpecialTokens, nil
}

// rebuildsPostProcessor lists the transformers fast tokenizer classes whose
// __init__ calls update_post_processor(): they replace tokenizer.json's
// post-processor by "[bos] $A [eos]" driven by add_bos_token (default True)
// and add_eos_token (default False). Other classes use tokenizer.json as is.
var rebuildsPostProcessor = map[string][2]string{ // class -> default bos, eos
	"LlamaTokenizer":         {"<s>", "</s>"},
	"LlamaTokenizerFast":     {"<s>", "</s>"},
	"CodeLlamaTokenizer":     {"<s>", "</s>"},
	"CodeLlamaTokenizerFast": {"<s>", "</s>"},
	"GemmaTokenizer":         {"<bos>", "<eos>"},
	"GemmaTokenizerFast":     {"<bos>", "<eos>"},
}

// configTemplate returns the template transformers builds, ok=false when
// the config does not override tokenizer.json.
func configTemplate(raw []byte, lookup func(string) (uint32, bool)) (template, bool, error) {
	var t template
	if len(raw) == 0 {
		return t, false, nil
	}
	var c tokenizerConfig
	if err := json.Unmarshal(raw, &c); err != nil {
		return t, false, fmt.Errorf("tokenizer_config.json: %w", err)
	}
	defs, ok := rebuildsPostProcessor[c.TokenizerClass]
	if !ok {
		return t, false, nil
	}
	addBOS, addEOS := true, false
	if c.AddBOS != nil {
		addBOS = *c.AddBOS
	}
	if c.AddEOS != nil {
		addEOS = *c.AddEOS
	}
	resolve := func(raw json.RawMessage, def, name string) (uint32, error) {
		content, present, err := tokenContent(raw)
		if err != nil {
			return 0, fmt.Errorf("tokenizer_config.json %s: %w", name, err)
		}
		if !present {
			content = def
		} else if content == "" {
			return 0, fmt.Errorf("tokenizer_config.json: add_%s = true but %s is null", name, name)
		}
		id, ok := lookup(content)
		if !ok {
			return 0, fmt.Errorf("tokenizer_config.json: %s %q is not a token", name, content)
		}
		return id, nil
	}
	if addBOS {
		id, err := resolve(c.BOS, defs[0], "bos_token")
		if err != nil {
			return t, false, err
		}
		t.lead = []uint32{id}
	}
	if addEOS {
		id, err := resolve(c.EOS, defs[1], "eos_token")
		if err != nil {
			return t, false, err
		}
		t.trail = []uint32{id}
	}
	return t, true, nil
}

// tokenContent reads a token given as "str" or {"content": "str", ...};
// present is false when the key is absent.
func tokenContent(raw json.RawMessage) (content string, present bool, err error) {
	if len(raw) == 0 {
		return "", false, nil
	}
	if string(raw) == "null" {
		return "", true, nil
	}
	if err := json.Unmarshal(raw, &content); err == nil {
		return content, true, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", true, err
	}
	return obj.Content, true, nil
}
