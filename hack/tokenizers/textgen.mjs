// textgen.mjs: deterministic text generators shared by gen-golden.mjs and bench.mjs.
//
// Everything here is a pure function of its seed, so the golden files and the 90 KB
// benchmark text can be regenerated bit-for-bit. Never use Math.random here.

// mulberry32: tiny, well-known 32-bit PRNG; plenty for fuzzing and fully reproducible.
export function prng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const r = {
    next,
    int: (n) => Math.floor(next() * n), // [0, n)
    range: (lo, hi) => lo + Math.floor(next() * (hi - lo + 1)), // [lo, hi]
    pick: (arr) => arr[Math.floor(next() * arr.length)],
    chance: (p) => next() < p,
  };
  return r;
}

// FNV-1a of a string, to derive per-model seeds from one base seed.
export function fnv1a(s) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(s, "utf8")) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

export const WORDS = (
  "the of and to in is that it was for on are as with his they at be this from have or by one had " +
  "not but what all were when we there can an your which their said if do will each about how up out " +
  "them then she many some so these would other into has more her two like him see time could no make " +
  "than first been its who now people my made over did down only way find use may water long little very " +
  "after words called just where most know get through back much before go good new write our used me man " +
  "too any day same right look think also around another came come work three word must because does part " +
  "tokenizer transformer attention cache prefix kubernetes vLLM router latency throughput Hello World " +
  "HELLO World's it's I'm you're we've they'll she'd DON'T I'M YOU'RE WE'VE THEY'LL SHE'D It'S wE'Re"
).split(" ");

export const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D", "'Re", "'rE"];

// Unicode whitespace the pre-tokenizer regexes treat as \s (and some they do not, e.g. U+200B, U+FEFF).
export const SPACES = [
  " ", "  ", "\t", "\n", "\r\n", "\r", "\v", "\f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001", "\u2002",
  "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029",
  "\u202f", "\u205f", "\u3000", "\u200b", "\ufeff", "\u180e",
];

export const COMBINING = [
  "e\u0301", "a\u0308", "o\u0302\u0323", "n\u0303", "A\u030a", "\u212b", "\u1e9b\u0323", "\u0041\u0300\u0316",
  "\u1100\u1161\u11a8", "\u0915\u093f", "q\u0307\u0323", "\u00e9", "Z\u0335\u0336\u0337", "i\u0307", "\u0627\u064b",
  "\u05d1\u05bc", "\u0e01\u0e34\u0e48", "\u304b\u3099", "\uff76\uff9e", "\u0301", "\u20dd",
];

export const EMOJI = [
  "\u{1F600}", "\u{1F44D}\u{1F3FD}", "\u{1F468}\u200d\u{1F469}\u200d\u{1F467}\u200d\u{1F466}",
  "\u{1F3F3}\ufe0f\u200d\u{1F308}", "\u{1F1FA}\u{1F1F8}", "\u{1F1EF}\u{1F1F5}\u{1F1E9}\u{1F1EA}",
  "1\ufe0f\u20e3", "\u2764\ufe0f", "\u{1F9D1}\u{1F3FF}\u200d\u{1F4BB}", "\u{1F3F4}\u{E0067}\u{E0062}\u{E0073}\u{E0063}\u{E0074}\u{E007F}",
  "\u{1F602}\u{1F602}\u{1F602}", "\u263a", "\u{1F469}\u200d\u2764\ufe0f\u200d\u{1F48B}\u200d\u{1F468}",
];

export const SCRIPTS = [
  "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002", // Chinese
  "\u6211\u4eec\u5728\u5927\u8bed\u8a00\u6a21\u578b\u4e2d\u4f7f\u7528\u5206\u8bcd\u5668",
  "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c\u3002\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a",
  "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4",
  "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u060c \u0643\u064a\u0641 \u062d\u0627\u0644\u0643\u061f",
  "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e\u0964 \u092f\u0939 \u090f\u0915 \u092a\u0930\u0940\u0915\u094d\u0937\u0923 \u0939\u0948",
  "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u042d\u0442\u043e \u0442\u0435\u0441\u0442.",
  "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
  "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
  "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e0a\u0e32\u0e27\u0e42\u0e25\u0e01",
  "Stra\u00dfe \u00e9t\u00e9 na\u00efve caf\u00e9 \u0130stanbul \u0131\u015f\u0131k",
  "\uff28\uff45\uff4c\uff4c\uff4f \uff11\uff12\uff13", // fullwidth (NFKC-sensitive)
  "\u2460\u2461\u2462 \u00bd \u2126 \ufb01 \u2167 \u33a1", // compatibility chars
  "\u{20000}\u{2A6D6}\u{1D400}\u{1D7D8}", // astral CJK ext B, math alnum
  "\ue000\uf8ff\u{F0000}", // private use (byte fallback)
  "\u2581hello\u2581world \u2581\u2581", // literal metaspace char
];

export const CODE = [
  "def f(x):\n    return x ** 2\n",
  "func main() {\n\tfmt.Println(\"hi\")\n}\n",
  "for (let i = 0; i < 10; i++) { console.log(i); }",
  "    if err != nil {\n        return nil, fmt.Errorf(\"load %s: %w\", path, err)\n    }\n",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
  "<div class=\"x\">&nbsp;<b>bold</b></div>",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);}",
  "x = [i for i in range(100) if i % 3 == 0]  # comment",
  "$ curl -sS http://127.0.0.1:8080/v1/score | jq .",
  "a_b__c___d ---- ==== ~~~~ ```python\n```",
];

const PUNCT = ["!", "?", ".", ",", ";", ":", "...", "--", "(", ")", "[", "]", "{", "}", "\"", "'", "`", "<", ">", "/", "\\", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=", "|", "~", "\u2014", "\u201c", "\u201d", "\u00bf", "\u00a1"];

function digits(r) {
  const n = r.pick([1, 2, 3, 4, 5, 7, 10, 16, 25, 40]);
  let s = "";
  for (let i = 0; i < n; i++) s += String.fromCharCode(48 + r.int(10));
  if (r.chance(0.2)) s = s.replace(/(\d)(?=(\d{3})+$)/g, "$1,");
  if (r.chance(0.15)) s += "." + r.range(0, 999);
  if (r.chance(0.1)) s = "\uff11\uff12" + s; // fullwidth digits
  return s;
}

function randomCodePoint(r) {
  // Mostly BMP (no surrogates), some astral; never a lone surrogate (JSON and
  // the Rust binding would both turn it into U+FFFD and hide real differences).
  for (;;) {
    let cp;
    const k = r.int(10);
    if (k < 6) cp = r.range(0x20, 0x2fff);
    else if (k < 8) cp = r.range(0x3000, 0xffff);
    else if (k < 9) cp = r.range(0x10000, 0x1ffff);
    else cp = r.range(0x0, 0x1f); // control characters, incl. NUL
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    return String.fromCodePoint(cp);
  }
}

function word(r) {
  let w = r.pick(WORDS);
  const c = r.int(6);
  if (c === 0) w = w.toUpperCase();
  else if (c === 1) w = w[0].toUpperCase() + w.slice(1);
  if (r.chance(0.12)) w += r.pick(CONTRACTIONS);
  return w;
}

// piece returns one fragment of one category; specials = the model's added tokens.
export function piece(r, specials) {
  const k = r.int(100);
  if (k < 30) {
    const n = r.range(1, 8);
    const ws = [];
    for (let i = 0; i < n; i++) ws.push(word(r));
    return ws.join(r.chance(0.85) ? " " : r.pick(SPACES));
  }
  if (k < 38) return r.pick(SPACES).repeat(r.chance(0.3) ? r.range(2, 40) : 1);
  if (k < 44) return r.pick(COMBINING);
  if (k < 50) return r.pick(EMOJI);
  if (k < 58) {
    const s = r.pick(SCRIPTS);
    const a = r.int(s.length);
    let out = s.slice(a, a + r.range(1, 20));
    if (/^[\udc00-\udfff]/.test(out)) out = out.slice(1); // do not cut a surrogate pair
    if (/[\ud800-\udbff]$/.test(out)) out = out.slice(0, -1);
    return out;
  }
  if (k < 64) return digits(r);
  if (k < 70) return r.pick(["\n", "\r\n", "\r", "\n\n", "\r\n\r\n", "\n\r", "\n \n", " \n", "\n\t"]).repeat(r.range(1, 4));
  if (k < 74) return r.pick([" ", "\t", "\n", "  \n"]).repeat(r.range(10, 120));
  if (k < 80) return r.pick(CODE);
  if (k < 85) return r.pick(PUNCT).repeat(r.chance(0.2) ? r.range(2, 6) : 1);
  if (k < 88) {
    let s = "";
    const n = r.range(1, 6);
    for (let i = 0; i < n; i++) s += randomCodePoint(r);
    return s;
  }
  if (k < 91) return r.pick(CONTRACTIONS);
  if (specials.length > 0) {
    const t = r.pick(specials);
    const m = r.int(6);
    if (m === 0) return " " + t + " "; // lstrip/rstrip sensitivity
    if (m === 1) return t.slice(0, Math.max(1, t.length - 1)); // truncated token: must not match
    if (m === 2) return t + t;
    if (m === 3) return "x" + t + "y";
    return t;
  }
  return word(r);
}

// fuzzString builds one fuzz case: 1..14 pieces, sometimes with leading/trailing spaces.
export function fuzzString(r, specials) {
  const n = r.range(1, 14);
  let s = "";
  for (let i = 0; i < n; i++) {
    s += piece(r, specials);
    if (r.chance(0.5)) s += " ";
  }
  if (r.chance(0.1)) s = " " + s;
  if (r.chance(0.1)) s = s + r.pick(SPACES);
  return s;
}

// mixedText builds a document of exactly-or-just-under `size` UTF-8 bytes: prose paragraphs,
// code, CJK and other scripts, numbers, emoji and whitespace runs. Used for the 20 KB
// golden text and for the 90 KB benchmark text (with different seeds).
export function mixedText(seed, size) {
  const r = prng(seed);
  const parts = [];
  let n = 0;
  while (n < size) {
    let p;
    const k = r.int(10);
    if (k < 5) {
      const ws = [];
      const m = r.range(20, 90);
      for (let i = 0; i < m; i++) ws.push(word(r) + (r.chance(0.1) ? r.pick([",", ".", ";", ":", "!", "?"]) : ""));
      p = ws.join(" ") + ".\n\n";
    } else if (k < 7) p = r.pick(CODE) + "\n";
    else if (k < 8) p = r.pick(SCRIPTS) + r.pick(SCRIPTS) + "\n";
    else if (k < 9) p = digits(r) + " " + r.pick(EMOJI) + " " + digits(r) + "\n";
    else p = r.pick(["    ", "\t", "  \n", "\r\n"]).repeat(r.range(1, 8)) + word(r) + "\n";
    parts.push(p);
    n += Buffer.byteLength(p, "utf8");
  }
  const buf = Buffer.from(parts.join(""), "utf8");
  let cut = size;
  while (cut > 0 && (buf[cut] & 0xc0) === 0x80) cut--; // never split a UTF-8 sequence
  return buf.subarray(0, cut).toString("utf8");
}
