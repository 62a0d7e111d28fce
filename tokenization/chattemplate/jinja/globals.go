package jinja

import (
	"fmt"
	"strings"
	"time"
)

// unsupportedGlobals are Jinja2 globals this engine does not provide.
var unsupportedGlobals = map[string]bool{"lipsum": true, "cycler": true, "joiner": true}

func (r *renderer) makeGlobals() map[string]any {
	now := r.env.Now
	if now == nil {
		now = time.Now
	}
	return map[string]any{
		"raise_exception": method("raise_exception", func(args []any, _ []kwval) any {
			msg := ""
			if len(args) > 0 {
				msg = toStr(args[0])
			}
			throwErr(&RaisedError{Message: msg})
			return nil
		}),
		"strftime_now": method("strftime_now", func(args []any, _ []kwval) any {
			if len(args) != 1 {
				throw("strftime_now takes one argument")
			}
			return strftime(now(), strArg(args[0], "format"))
		}),
		"namespace": method("namespace", func(args []any, kws []kwval) any {
			ns := &Namespace{attrs: NewDict()}
			for _, a := range args {
				d, ok := a.(*DictVal)
				if !ok {
					throw("namespace() positional argument must be a dict")
				}
				for i, k := range d.keys {
					_ = ns.attrs.Set(k, d.vals[i])
				}
			}
			for _, k := range kws {
				_ = ns.attrs.Set(k.name, k.val)
			}
			return ns
		}),
		"range": method("range", func(args []any, _ []kwval) any {
			var start, stop, step int64 = 0, 0, 1
			ints := make([]int64, len(args))
			for i, a := range args {
				v, ok := intOf(a)
				if !ok {
					throw("range() arguments must be integers")
				}
				ints[i] = v
			}
			switch len(ints) {
			case 1:
				stop = ints[0]
			case 2:
				start, stop = ints[0], ints[1]
			case 3:
				start, stop, step = ints[0], ints[1], ints[2]
			default:
				throw("range expected 1 to 3 arguments")
			}
			if step == 0 {
				throw("range() arg 3 must not be zero")
			}
			out := &ListVal{}
			for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
				if len(out.Items) >= maxRangeLen {
					throw("range too big, more than %d items", maxRangeLen)
				}
				out.Items = append(out.Items, i)
			}
			return out
		}),
		"dict": method("dict", func(args []any, kws []kwval) any {
			d := NewDict()
			for _, a := range args {
				src, ok := a.(*DictVal)
				if !ok {
					throw("dict() positional argument must be a dict")
				}
				for i, k := range src.keys {
					_ = d.Set(k, src.vals[i])
				}
			}
			for _, k := range kws {
				_ = d.Set(k.name, k.val)
			}
			return d
		}),
	}
}

// strftime implements the C-locale directives chat templates use.
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 >= len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case '-':
			if i+1 < len(f) {
				i++
				switch f[i] {
				case 'd':
					fmt.Fprintf(&b, "%d", t.Day())
				case 'm':
					fmt.Fprintf(&b, "%d", int(t.Month()))
				case 'H':
					fmt.Fprintf(&b, "%d", t.Hour())
				default:
					throwErr(&RenderError{Msg: fmt.Sprintf("unsupported strftime directive %%-%c", f[i])})
				}
			}
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			fmt.Fprintf(&b, "%02d", h)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'F':
			b.WriteString(t.Format("2006-01-02"))
		case 'T':
			b.WriteString(t.Format("15:04:05"))
		case '%':
			b.WriteByte('%')
		default:
			throwErr(&RenderError{Msg: fmt.Sprintf("unsupported strftime directive %%%c", f[i])})
		}
	}
	return b.String()
}
