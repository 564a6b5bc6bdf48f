package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
	"golang.org/x/text/unicode/norm"

	"github.com/infera/infera/jinja"
)

// HF is a Hugging Face byte-level BPE tokenizer with its chat template,
// loaded from a model directory by Load. It is safe for concurrent use.
type HF struct {
	model     bpe
	maxDigits int  // 1 for the Qwen2 split pattern, 3 for cl100k
	nfc       bool // normalizer is NFC

	vocab  map[string]uint32 // raw token bytes -> id (model vocab)
	tokens [][]byte          // id -> raw bytes (model vocab and added tokens)

	added      []addedToken // sorted by content length, longest first
	addedFirst [256]bool    // first bytes of added tokens
	// spacedAdded: some added token holds a space between two non-spaces,
	// so Cut cannot promise a prefix-stable cut before such a space.
	spacedAdded bool

	sections sectionCache

	// prefix: the special tokens the post-processor puts before a plain
	// prompt's tokens (a BOS), as the engine encodes a completion's prompt;
	// suffix: those it puts after them (an EOS, with add_eos_token).
	prefix, suffix []uint32

	chat    *jinja.Template
	chatSrc string
	// contentParts: the template loops over message contents, so it gets
	// them as lists of parts (vLLM's --chat-template-content-format auto).
	contentParts bool
	bosToken     string
	eosToken     string
	tools        toolsCache
	kwargs       toolsCache // parsed chat_template_kwargs objects, as tools
	args         toolsCache // decoded tool call arguments, as tools
	// defaults: the server's default chat_template_kwargs (vLLM's
	// --default-chat-template-kwargs), under every request's (SetDefaultKwargs).
	defaults *jinja.Object
}

type addedToken struct {
	content []byte
	id      uint32
	special bool
}

var _ Tokenizer = (*HF)(nil)

type hfJSON struct {
	AddedTokens []struct {
		ID         uint32 `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type                    string            `json:"type"`
		Vocab                   map[string]uint32 `json:"vocab"`
		Merges                  json.RawMessage   `json:"merges"`
		ByteFallback            bool              `json:"byte_fallback"`
		ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
		Dropout                 *float64          `json:"dropout"`
		IgnoreMerges            bool              `json:"ignore_merges"`
	} `json:"model"`
}

type component struct {
	Type           string          `json:"type"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	Normalizers    []component     `json:"normalizers"`
	Pretokenizers  []component     `json:"pretokenizers"`
}

// Load reads tokenizer.json and tokenizer_config.json from dir. It fails on
// any tokenizer feature it does not implement exactly rather than encoding
// differently from the reference.
func Load(dir string) (*HF, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read tokenizer: %w", err)
	}
	var tj hfJSON
	if err := gojson.Unmarshal(data, &tj); err != nil {
		return nil, fmt.Errorf("cannot parse %q: %w", path, err)
	}
	h := &HF{}
	h.args.entries = argsCacheEntries
	h.model.cache = newWordCache()
	h.sections = newSectionCache()
	if err := h.loadModel(&tj); err != nil {
		return nil, fmt.Errorf("unsupported tokenizer %q: %w", path, err)
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	cfg, err := os.ReadFile(cfgPath)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return h, nil
		}
		return nil, fmt.Errorf("cannot read tokenizer config: %w", err)
	}
	if err := h.loadConfig(cfg); err != nil {
		return nil, fmt.Errorf("cannot load %q: %w", cfgPath, err)
	}
	return h, nil
}

func (h *HF) loadModel(tj *hfJSON) error {
	m := &tj.Model
	if m.Type != "BPE" && m.Type != "" {
		return fmt.Errorf("model type %q (only BPE is supported)", m.Type)
	}
	if m.ByteFallback {
		return errors.New("byte_fallback BPE is not supported")
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return errors.New("continuing_subword_prefix is not supported")
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return errors.New("end_of_word_suffix is not supported")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return errors.New("BPE dropout is not supported")
	}
	if err := h.checkNormalizer(tj.Normalizer); err != nil {
		return err
	}
	if err := h.checkPreTokenizer(tj.PreTokenizer); err != nil {
		return err
	}
	if err := checkByteLevel(tj.Decoder, "decoder"); err != nil {
		return err
	}
	if err := h.checkPostProcessor(tj.PostProcessor); err != nil {
		return err
	}

	_, dec := byteLevelAlphabet()
	toBytes := func(tok string) ([]byte, error) {
		b := make([]byte, 0, len(tok))
		for _, r := range tok {
			c, ok := dec[r]
			if !ok {
				return nil, fmt.Errorf("token %q is not byte-level encoded", tok)
			}
			b = append(b, c)
		}
		return b, nil
	}
	maxID := uint32(0)
	for _, id := range m.Vocab {
		maxID = max(maxID, id)
	}
	for _, at := range tj.AddedTokens {
		maxID = max(maxID, at.ID)
	}
	if maxID > 1<<24 {
		return fmt.Errorf("token id %d too large", maxID)
	}
	h.tokens = make([][]byte, maxID+1)
	h.vocab = make(map[string]uint32, len(m.Vocab))
	for tok, id := range m.Vocab {
		b, err := toBytes(tok)
		if err != nil {
			return err
		}
		h.vocab[string(b)] = id
		h.tokens[id] = b
	}
	for b := 0; b < 256; b++ {
		id, ok := h.vocab[string([]byte{byte(b)})]
		if !ok {
			return fmt.Errorf("vocab lacks byte 0x%02x", b)
		}
		h.model.byteID[b] = id
	}

	if m.IgnoreMerges {
		// A pre-token found whole in the vocab is that token (Llama 3).
		h.model.whole = h.vocab
	}

	merges, err := parseMerges(m.Merges)
	if err != nil {
		return err
	}
	h.model.merges = make(map[uint64]merge, len(merges))
	for rank, p := range merges {
		a, err := toBytes(p[0])
		if err != nil {
			return err
		}
		b, err := toBytes(p[1])
		if err != nil {
			return err
		}
		ia, okA := h.vocab[string(a)]
		ib, okB := h.vocab[string(b)]
		im, okM := h.vocab[string(a)+string(b)]
		if !okA || !okB || !okM {
			return fmt.Errorf("merge %d (%q %q) refers to tokens missing from the vocab", rank, p[0], p[1])
		}
		k := pairKey(ia, ib)
		if _, dup := h.model.merges[k]; !dup {
			h.model.merges[k] = merge{rank: uint32(rank), id: im}
		}
	}

	for _, at := range tj.AddedTokens {
		if at.Content == "" {
			continue
		}
		if at.LStrip || at.RStrip || at.SingleWord {
			return fmt.Errorf("added token %q: lstrip/rstrip/single_word are not supported", at.Content)
		}
		if at.Normalized && h.nfc && !isNFC([]byte(at.Content)) {
			return fmt.Errorf("added token %q changes under normalization", at.Content)
		}
		h.added = append(h.added, addedToken{content: []byte(at.Content), id: at.ID, special: at.Special})
		h.spacedAdded = h.spacedAdded || spacedAt([]byte(at.Content), 1, len(at.Content)) >= 0
		h.tokens[at.ID] = []byte(at.Content)
		h.addedFirst[at.Content[0]] = true
	}
	sort.SliceStable(h.added, func(i, j int) bool { return len(h.added[i].content) > len(h.added[j].content) })
	return nil
}

func parseMerges(raw json.RawMessage) ([][2]string, error) {
	var pairs [][2]string
	if err := gojson.Unmarshal(raw, &pairs); err == nil {
		return pairs, nil
	}
	var strs []string
	if err := gojson.Unmarshal(raw, &strs); err != nil {
		return nil, fmt.Errorf("cannot parse merges: %w", err)
	}
	pairs = make([][2]string, len(strs))
	for i, s := range strs {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return nil, fmt.Errorf("merge %d %q has no space", i, s)
		}
		pairs[i] = [2]string{a, b}
	}
	return pairs, nil
}

func (h *HF) checkNormalizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("cannot parse normalizer: %w", err)
	}
	switch {
	case c.Type == "NFC":
		h.nfc = true
	case c.Type == "Sequence" && len(c.Normalizers) == 0:
	case c.Type == "Sequence" && len(c.Normalizers) == 1 && c.Normalizers[0].Type == "NFC":
		h.nfc = true
	default:
		return fmt.Errorf("normalizer %s is not supported", brief(raw))
	}
	return nil
}

func (h *HF) checkPreTokenizer(raw json.RawMessage) error {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("cannot parse pre_tokenizer: %w", err)
	}
	if c.Type != "Sequence" || len(c.Pretokenizers) != 2 {
		return fmt.Errorf("pre_tokenizer %s is not supported (want Sequence[Split, ByteLevel])", brief(raw))
	}
	split, bl := c.Pretokenizers[0], c.Pretokenizers[1]
	var pat struct {
		Regex *string `json:"Regex"`
	}
	if split.Type != "Split" || json.Unmarshal(split.Pattern, &pat) != nil || pat.Regex == nil {
		return fmt.Errorf("pre_tokenizer %s is not supported (want a Split with a Regex)", brief(raw))
	}
	switch *pat.Regex {
	case qwen2Pattern:
		h.maxDigits = 1
	case cl100kPattern:
		h.maxDigits = 3
	default:
		return fmt.Errorf("pre_tokenizer split pattern %q is not supported", *pat.Regex)
	}
	if split.Behavior != "Isolated" || split.Invert {
		return fmt.Errorf("pre_tokenizer split behavior %q invert=%v is not supported", split.Behavior, split.Invert)
	}
	if bl.Type != "ByteLevel" || bl.AddPrefixSpace || (bl.UseRegex != nil && *bl.UseRegex) {
		return fmt.Errorf("pre_tokenizer %s is not supported (want ByteLevel without prefix space or regex)", brief(raw))
	}
	return nil
}

// maxBrief bounds the JSON of a tokenizer component quoted in an error.
const maxBrief = 300

// brief returns a component's JSON for an error message: on one line, and
// cut at maxBrief bytes (a normalizer's precompiled_charsmap alone is
// hundreds of kilobytes).
func brief(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		b.Reset()
		b.Write(raw)
	}
	if b.Len() <= maxBrief {
		return b.String()
	}
	cut := maxBrief
	for cut > 0 && !utf8.RuneStart(b.Bytes()[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes)", b.Bytes()[:cut], len(raw))
}

func checkByteLevel(raw json.RawMessage, what string) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("cannot parse %s: %w", what, err)
	}
	if c.Type != "ByteLevel" {
		return fmt.Errorf("%s %s is not supported", what, brief(raw))
	}
	return nil
}

// postProcessor is the part of a post_processor Load reads.
type postProcessor struct {
	Type       string          `json:"type"`
	Processors []postProcessor `json:"processors"`
	Single     []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	} `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
}

// checkPostProcessor accepts no post_processor, ByteLevel (it moves
// offsets only) and a TemplateProcessing whose template for one sequence
// is special tokens then the sequence (Llama 3.1's and DeepSeek's BOS),
// alone or in a Sequence. Those tokens become h.prefix: the engine puts
// them before a plain prompt's tokens (vLLM's add_special_tokens, on by
// default for completions), not before a rendered chat's.
func (h *HF) checkPostProcessor(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var p postProcessor
	if err := json.Unmarshal(raw, &p); err != nil {
		return fmt.Errorf("cannot parse post_processor: %w", err)
	}
	procs := []postProcessor{p}
	if p.Type == "Sequence" {
		procs = p.Processors
	}
	seen := false
	for _, p := range procs {
		switch p.Type {
		case "ByteLevel":
			continue
		case "TemplateProcessing":
		default:
			return fmt.Errorf("post_processor %q is not supported", p.Type)
		}
		if seen {
			return errors.New("post_processor with two TemplateProcessing steps is not supported")
		}
		seen = true
		for i, piece := range p.Single {
			switch {
			case piece.Sequence != nil && piece.Sequence.ID == "A" && i == len(p.Single)-1:
			case piece.SpecialToken != nil && i < len(p.Single)-1:
				st, ok := p.SpecialTokens[piece.SpecialToken.ID]
				if !ok || len(st.IDs) == 0 {
					return fmt.Errorf("post_processor special token %q has no ids", piece.SpecialToken.ID)
				}
				h.prefix = append(h.prefix, st.IDs...)
			default:
				return errors.New("post_processor template for one sequence is not supported (only special tokens before the sequence are)")
			}
		}
	}
	return nil
}

func (h *HF) loadConfig(data []byte) error {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		AddBOS       json.RawMessage `json:"add_bos_token"`
		AddEOS       json.RawMessage `json:"add_eos_token"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		return err
	}
	h.bosToken = tokenString(cfg.BOS)
	h.eosToken = tokenString(cfg.EOS)
	if len(cfg.AddBOS) > 0 || len(cfg.AddEOS) > 0 {
		// As transformers v5 loads every tokenizer class (the current vLLM
		// release installs v5: its pin excludes only 5.0-5.5.0), with or
		// without a tokenizer_class: TokenizersBackend.__init__
		// (tokenization_utils_tokenizers.py) calls update_post_processor
		// when tokenizer_config.json names add_bos_token or add_eos_token,
		// replacing tokenizer.json's post_processor by bos_token when
		// add_bos_token (default false), the sequence, and eos_token when
		// add_eos_token (default false); a null bos_token or eos_token is
		// left out. Otherwise tokenizer.json's post_processor stands.
		h.prefix, h.suffix = nil, nil
		if truthy(cfg.AddBOS) && h.bosToken != "" {
			id, err := h.specialID("bos_token", h.bosToken)
			if err != nil {
				return err
			}
			h.prefix = []uint32{id}
		}
		if truthy(cfg.AddEOS) && h.eosToken != "" {
			id, err := h.specialID("eos_token", h.eosToken)
			if err != nil {
				return err
			}
			h.suffix = []uint32{id}
		}
	}
	src, err := chatTemplateSource(cfg.ChatTemplate)
	if err != nil {
		return err
	}
	if src == "" {
		return nil
	}
	// Strips as Python's str.strip does (with its chars argument) and
	// writes None and booleans as Python's str does: vLLM renders the
	// template with Python's jinja2. Qwen3's
	// content.split('</think>')[-1].lstrip('\n') keeps a leading space
	// that @huggingface/jinja's strip drops, and Qwen3-Coder's and
	// Qwen3.5's tool calls write a boolean argument as True.
	if h.chat, err = jinja.ParseWithOptions(src, jinja.Options{PythonStrip: true, PythonPrint: true, PythonCompare: true}); err != nil {
		return fmt.Errorf("cannot parse chat_template: %w", err)
	}
	h.chatSrc = src
	h.contentParts = h.chat.IteratesMessageContent()
	return nil
}

// specialID returns the id of the special token tok (tokenizer_config.json's
// name), which the post-processor adds around a sequence (transformers
// would add a token missing from the vocabulary as a new one).
func (h *HF) specialID(name, tok string) (uint32, error) {
	id, ok := h.TokenID(tok)
	if !ok {
		return 0, fmt.Errorf("%s %q is not in the vocabulary", name, tok)
	}
	return id, nil
}

// truthy reports whether the JSON value v is true as Python's bool() has
// it: not null, false, 0, "", [] or {}.
func truthy(v json.RawMessage) bool {
	var x any
	if json.Unmarshal(v, &x) != nil {
		return false
	}
	switch x := x.(type) {
	case bool:
		return x
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return false
}

func tokenString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

// chatTemplateSource accepts a template string or a list of named
// templates, choosing "default".
func chatTemplateSource(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("cannot parse chat_template: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", errors.New("chat_template list has no \"default\" entry")
}

// VocabSize returns the number of token ids (model vocab plus added tokens).
func (h *HF) VocabSize() int { return len(h.tokens) }

// TokenID returns the id of a token given as raw text (for example
// "<|im_end|>").
func (h *HF) TokenID(tok string) (uint32, bool) {
	for _, at := range h.added {
		if string(at.content) == tok {
			return at.id, true
		}
	}
	id, ok := h.vocab[tok]
	return id, ok
}

// PromptSpecialTokens returns the ids the engine puts before a plain
// prompt's tokens (its post-processor's special tokens, such as Llama
// 3.1's <|begin_of_text|>; none for Qwen) and after them (an EOS, with
// add_eos_token; none for most tokenizers). A rendered chat holds its own
// (the template writes bos_token) and gets none unless the request asks
// for add_special_tokens.
func (h *HF) PromptSpecialTokens() (prefix, suffix []uint32) { return h.prefix, h.suffix }

// EOSToken returns tokenizer_config.json's eos_token.
func (h *HF) EOSToken() string { return h.eosToken }

// RendersContentParts reports whether the chat template gets message
// contents as lists of parts (it loops over them: vLLM's "openai" content
// format).
func (h *HF) RendersContentParts() bool { return h.contentParts }

// ChatTemplate returns the chat template source, or "" if there is none.
func (h *HF) ChatTemplate() string { return h.chatSrc }

// Encode implements Tokenizer. Added tokens written literally in text are
// matched (leftmost, longest first) before normalization and
// pre-tokenization, as the reference does.
func (h *HF) Encode(dst []uint32, text []byte) []uint32 { return h.encode(dst, text, true) }

// encode is Encode, with the section cache when cached is set (the tests
// check the cache against encode without it).
func (h *HF) encode(dst []uint32, text []byte, cached bool) []uint32 {
	sc := scratchPool.Get().(*scratch)
	start := 0
	for i := 0; i < len(text); i++ {
		if !h.addedFirst[text[i]] {
			continue
		}
		at := h.matchAdded(text[i:])
		if at == nil {
			continue
		}
		dst = h.encodeSection(dst, text[start:i], sc, cached)
		dst = append(dst, at.id)
		i += len(at.content) - 1
		start = i + 1
	}
	dst = h.encodeSection(dst, text[start:], sc, cached)
	scratchPool.Put(sc)
	return dst
}

func (h *HF) matchAdded(s []byte) *addedToken {
	for k := range h.added {
		if bytes.HasPrefix(s, h.added[k].content) {
			return &h.added[k]
		}
	}
	return nil
}

func (h *HF) encodeSection(dst []uint32, s []byte, sc *scratch, cached bool) []uint32 {
	if len(s) == 0 {
		return dst
	}
	if !cached {
		return h.encodeWords(dst, s, sc)
	}
	if ids, ok := h.sections.get(s); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = h.encodeWords(dst, s, sc)
	h.sections.put(s, dst[start:])
	return dst
}

func (h *HF) encodeWords(dst []uint32, s []byte, sc *scratch) []uint32 {
	if h.nfc && !isASCII(s) && !norm.NFC.IsNormal(s) {
		sc.norm = appendNFC(sc.norm[:0], s)
		s = sc.norm
	}
	for i := 0; i < len(s); {
		n := matchAt(s, i, h.maxDigits)
		dst = h.model.encodeWord(dst, s[i:i+n], sc)
		i += n
	}
	return dst
}

func isASCII(s []byte) bool {
	for _, c := range s {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// AppendDecode appends the text of ids to dst. Unknown ids are skipped.
func (h *HF) AppendDecode(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		if int(id) < len(h.tokens) {
			dst = append(dst, h.tokens[id]...)
		}
	}
	return dst
}

// Decode returns the text of ids (invalid UTF-8 is kept as is).
func (h *HF) Decode(ids []uint32) string { return string(h.AppendDecode(nil, ids)) }

// ErrNoChatTemplate is returned when rendering a chat without a template.
var ErrNoChatTemplate = errors.New("tokenizer has no chat_template")

// RenderChat implements Tokenizer. Messages become objects with role and
// content always set, and name, tool_call_id, tool_calls and
// reasoning_content set only when non-empty; tool call arguments are
// decoded from their JSON text as vLLM decodes them (an empty object when
// they are not JSON). A warm call (the same tools, if any, seen
// recently) allocates nothing beyond the growth of dst.
func (h *HF) RenderChat(dst []byte, msgs []Message, tools []byte, addGenerationPrompt bool) ([]byte, error) {
	return h.RenderChatFields(dst, msgs, ChatFields{Tools: tools}, addGenerationPrompt)
}

// RenderChatFields implements FieldsRenderer: RenderChat with the
// request's documents and chat_template_kwargs too. The same tools and
// chat_template_kwargs seen recently are not parsed again, so a warm call
// without documents allocates nothing beyond the growth of dst.
func (h *HF) RenderChatFields(dst []byte, msgs []Message, f ChatFields, addGenerationPrompt bool) ([]byte, error) {
	toolsV, err := h.tools.parse(f.Tools, dumpTools)
	if err != nil {
		return dst, fmt.Errorf("cannot parse tools: %w", err)
	}
	docs, kw, err := h.parseFields(f)
	if err != nil {
		return dst, err
	}
	cv := acquireChatVars()
	defer cv.release()
	msgsV, err := cv.messages(msgs, &h.args, h.contentParts)
	if err != nil {
		return dst, err
	}
	return h.render(dst, cv, msgsV, toolsV, docs, addGenerationPrompt, kw, f.ReasoningEffort)
}

// parseFields parses f's documents (not cached: they change with every
// request) and chat_template_kwargs (an object, or nil when absent).
func (h *HF) parseFields(f ChatFields) (docs jinja.Value, kw *jinja.Object, err error) {
	docs = jinja.Undefined()
	if len(f.Documents) > 0 {
		if docs, err = jinja.FromJSON(f.Documents); err != nil {
			return docs, nil, fmt.Errorf("cannot parse documents: %w", err)
		}
		if docs.Kind() == jinja.KindNull {
			docs = jinja.Undefined()
		}
	}
	kwV, err := h.kwargs.parse(f.Kwargs, nil)
	if err != nil {
		return docs, nil, fmt.Errorf("cannot parse chat_template_kwargs: %w", err)
	}
	switch kwV.Kind() {
	case jinja.KindObject:
		kw = kwV.Object()
	case jinja.KindUndefined, jinja.KindNull:
	default:
		return docs, nil, errors.New("chat_template_kwargs must be a JSON object")
	}
	return docs, kw, nil
}

// RenderChatJSON renders a conversation given as a raw JSON messages array
// (any shape the template understands, for example tool call arguments as
// objects) and optional raw JSON tools. extra holds further template
// variables such as enable_thinking; it may be nil.
func (h *HF) RenderChatJSON(dst []byte, messages, tools []byte, addGenerationPrompt bool, extra *jinja.Object) ([]byte, error) {
	msgs, err := jinja.FromJSON(messages)
	if err != nil {
		return dst, fmt.Errorf("cannot parse messages: %w", err)
	}
	if msgs.Kind() != jinja.KindArray {
		return dst, errors.New("messages must be a JSON array")
	}
	toolsV, err := h.tools.parse(tools, dumpTools)
	if err != nil {
		return dst, fmt.Errorf("cannot parse tools: %w", err)
	}
	if toolsV.Kind() == jinja.KindNull {
		toolsV = jinja.Undefined()
	}
	cv := acquireChatVars()
	defer cv.release()
	return h.render(dst, cv, msgs, toolsV, jinja.Undefined(), addGenerationPrompt, extra, "")
}

// applyChatTemplateParams are the parameters of transformers'
// apply_chat_template that it consumes itself: given in
// chat_template_kwargs they never reach the template as variables (tools
// and documents do, as vLLM merges them: render).
var applyChatTemplateParams = [...]string{"conversation", "chat_template", "continue_final_message", "tokenize",
	"padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"}

// SetDefaultKwargs sets the chat_template_kwargs every chat is rendered
// with under its own, as vLLM's --default-chat-template-kwargs does
// (OnlineRenderer.preprocess_chat: renderers.merge_kwargs puts the
// request's tools over the defaults, then ChatParams.with_defaults the
// request's kwargs and fields over both, dropping the request's null and
// "auto" values but not the defaults'). js is a JSON object; null or empty
// clears the defaults. Keys naming what the template does not get as a
// variable (chat_template, tokenize, conversation, messages) are refused:
// the engine would render another template or return tokens. Call it
// before the first render: it is not safe beside rendering.
func (h *HF) SetDefaultKwargs(js []byte) error {
	js = bytes.TrimSpace(js)
	if len(js) == 0 || string(js) == "null" {
		h.defaults = nil
		return nil
	}
	v, err := jinja.FromJSONMax(js, MaxToolValues)
	if err != nil {
		return fmt.Errorf("default chat_template_kwargs: %w", err)
	}
	if v.Kind() != jinja.KindObject {
		return errors.New("default chat_template_kwargs must be a JSON object")
	}
	for _, k := range v.Object().Keys() {
		switch k {
		case "chat_template", "tokenize", "conversation", "messages":
			return fmt.Errorf("default chat_template_kwargs: %q is not a template variable (the engine would render another template or return tokens)", k)
		}
	}
	h.defaults = v.Object()
	return nil
}

// DefaultKwargs returns the defaults SetDefaultKwargs set (nil: none).
func (h *HF) DefaultKwargs() *jinja.Object { return h.defaults }

// render renders the template with msgs, tools, documents (None when
// absent, as transformers passes them), add_generation_prompt and the
// special tokens, then extra's keys (chat_template_kwargs) over them as
// vLLM merges them (ChatCompletionRequest.build_chat_params, then
// ChatParams.with_defaults in OnlineRenderer.preprocess_chat, both through
// renderers.merge_kwargs, which drops the values None and "auto"): the
// request's add_generation_prompt, continue_final_message, documents and
// reasoning_effort (effort, "" when absent) are merged over the kwargs,
// and the kwargs over the request's tools; a kwarg that is null or
// "auto" is dropped; apply_chat_template's own parameters never become
// variables.
func (h *HF) render(dst []byte, cv *chatVars, msgs, tools, docs jinja.Value, addGen bool, extra *jinja.Object, effort string) ([]byte, error) {
	if h.chat == nil {
		return dst, ErrNoChatTemplate
	}
	vars := cv.object()
	vars.Set("messages", msgs)
	// Absent tools and documents are None, as transformers passes them
	// (render_jinja_template's tools=None, documents=None): a template's
	// `tools is not none` is false, `tools is defined` true.
	if tools.IsUndefined() {
		tools = jinja.Null()
	}
	docsGiven := !docs.IsUndefined() && docs.Kind() != jinja.KindNull
	if !docsGiven {
		docs = jinja.Null()
	}
	vars.Set("tools", tools)
	vars.Set("documents", docs)
	vars.Set("add_generation_prompt", jinja.Bool(addGen))
	vars.Set("bos_token", jinja.String(h.bosToken))
	vars.Set("eos_token", jinja.String(h.eosToken))
	if h.defaults != nil {
		toolsGiven := tools.Kind() != jinja.KindNull
		setKwargs(vars, h.defaults, false, toolsGiven, docsGiven, effort)
	}
	if extra != nil {
		setKwargs(vars, extra, true, false, docsGiven, effort)
	}
	if effort != "" {
		vars.Set("reasoning_effort", jinja.String(effort))
		// vLLM adds enable_thinking unless the kwargs name it (even as
		// null, which merge_kwargs then drops).
		if _, given := extra.Get("enable_thinking"); !given {
			vars.Set("enable_thinking", jinja.Bool(effort != "none"))
		}
	}
	out, err := h.chat.Render(dst, vars)
	if err != nil {
		return dst, fmt.Errorf("cannot render chat template: %w", err)
	}
	return out, nil
}

// setKwargs sets kw's keys as template variables, but not those the
// request's own fields win over (its add_generation_prompt, documents and
// reasoning_effort when given) nor apply_chat_template's own parameters.
// request: kw is the request's chat_template_kwargs, whose null and "auto"
// values are dropped (merge_kwargs' unset values); else kw is the server's
// defaults, under the request's tools too (toolsGiven) and kept whole.
func setKwargs(vars, kw *jinja.Object, request, toolsGiven, docsGiven bool, effort string) {
keys:
	for _, k := range kw.Keys() {
		switch k {
		case "add_generation_prompt":
			continue // the request's own, always given (default true)
		case "tools":
			if toolsGiven {
				continue
			}
		case "documents":
			if docsGiven {
				continue
			}
		case "reasoning_effort":
			if effort != "" {
				continue
			}
		}
		for _, p := range applyChatTemplateParams {
			if k == p {
				continue keys
			}
		}
		v, _ := kw.Get(k)
		if request && (v.Kind() == jinja.KindNull || v.Kind() == jinja.KindString && v.Str() == "auto") {
			continue
		}
		vars.Set(k, v)
	}
}
