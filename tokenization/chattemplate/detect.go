package chattemplate

import "github.com/kvindex/kvindex/tokenization/chattemplate/jinja"

// detectFormat is vLLM's content-format detection: "openai" when the
// template has a for loop over X['content'] or X.content where X is the
// target of a for loop over messages (or over a variable assigned from
// messages, possibly filtered or sliced), or a loop over a variable named
// content; "string" otherwise, including when vLLM's walk would give up (a
// tuple loop target or a namespace assignment where it expects a plain name).
func detectFormat(t *jinja.Template) ContentFormat {
	var assigns []*jinja.Assign
	var loops []*jinja.For
	t.Walk(func(n jinja.Node) bool {
		switch n := n.(type) {
		case *jinja.Assign:
			assigns = append(assigns, n)
		case *jinja.For:
			loops = append(loops, n)
		}
		return true
	})
	// Variables holding messages: breadth first from "messages".
	msgVars := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for q := 0; q < len(msgVars); q++ {
		for _, a := range assigns {
			if !accessOf(a.Value, msgVars[q], "") {
				continue
			}
			name, ok := a.Target.(*jinja.Name)
			if !ok {
				return FormatString
			}
			if !seen[name.Name] {
				seen[name.Name] = true
				msgVars = append(msgVars, name.Name)
			}
		}
	}
	var itemVars []string
	for _, l := range loops {
		for _, v := range msgVars {
			if accessOf(l.Iter, v, "") {
				name, ok := l.Target.(*jinja.Name)
				if !ok {
					return FormatString
				}
				itemVars = append(itemVars, name.Name)
				break
			}
		}
	}
	for _, l := range loops {
		for _, v := range itemVars {
			if accessOf(l.Iter, v, "content") {
				if _, ok := l.Target.(*jinja.Name); !ok {
					return FormatString
				}
				return FormatOpenAI
			}
		}
	}
	// vLLM's fallback (vllm-project/vllm#42660): a loop over a variable
	// named "content", as templates that pass content to a macro write it.
	for _, l := range loops {
		if isName(l.Iter, "content") {
			if _, ok := l.Target.(*jinja.Name); !ok {
				return FormatString
			}
			return FormatOpenAI
		}
	}
	return FormatString
}

// accessOf reports whether n reads variable v (key == "") or v's key item
// or attribute, possibly through filters, tests and slices.
func accessOf(n jinja.Node, v, key string) bool {
	switch n := n.(type) {
	case *jinja.Filter:
		return n.Arg != nil && accessOf(n.Arg, v, key)
	case *jinja.Test:
		return accessOf(n.Arg, v, key)
	case *jinja.Item:
		if _, ok := n.Index.(*jinja.Slice); ok {
			return accessOf(n.X, v, key)
		}
		if key != "" {
			c, ok := n.Index.(*jinja.Const)
			return ok && c.Value == key && isName(n.X, v)
		}
	case *jinja.Attr:
		if key != "" {
			return n.Name == key && isName(n.X, v)
		}
	}
	if key == "" {
		return isName(n, v)
	}
	return false
}

func isName(n jinja.Node, v string) bool {
	name, ok := n.(*jinja.Name)
	return ok && name.Name == v
}
