/* src/tokenizer/bpe.cpp - byte-level BPE: added tokens, merges, encode and decode (dllm_tokenizer). */

// ---- The tokenizer ----------------------------------------------------------------------------------

struct dllm__added_token {
    std::string content;
    int32_t id = -1;
    bool special = false, lstrip = false, rstrip = false, normalized = false;
};

/* Byte trie over added-token contents, for leftmost-longest matching (HF uses Aho-Corasick with
 * MatchKind::LeftmostLongest: the earliest start wins, then the longest token there). */
struct dllm__trie {
    std::vector<int32_t> token = {-1};               // node -> index in dllm_tokenizer::added, or -1
    std::unordered_map<uint64_t, int32_t> children;  // (node << 8 | byte) -> node

    void insert(const std::string &s, int32_t index) {
        int32_t node = 0;
        for (unsigned char b : s) {
            auto it = children.find((uint64_t)node << 8 | b);
            if (it == children.end()) {
                it = children.emplace((uint64_t)node << 8 | b, (int32_t)token.size()).first;
                token.push_back(-1);
            }
            node = it->second;
        }
        token[(size_t)node] = index;
    }
    /* The longest token starting at text[pos]: its index (or -1) and length. */
    int32_t longest(const std::string &text, size_t pos, size_t &len) const {
        int32_t node = 0, best = -1;
        for (size_t k = pos; k < text.size(); k++) {
            auto it = children.find((uint64_t)node << 8 | (unsigned char)text[k]);
            if (it == children.end()) break;
            node = it->second;
            if (token[(size_t)node] >= 0) {
                best = token[(size_t)node];
                len = k + 1 - pos;
            }
        }
        return best;
    }
};

enum { DLLM__BPE_CACHE_MAX = 1 << 16, DLLM__BPE_CACHE_PIECE = 256 };

}  // namespace
struct dllm_tokenizer {
    std::string dir;
    std::unordered_map<std::string, int32_t> vocab;                    // BPE vocabulary (byte-mapped strings)
    std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
    std::vector<dllm__added_token> added;
    std::unordered_map<std::string, int32_t> added_ids;  // content -> id
    dllm__trie raw_trie, normalized_trie;                // added tokens matched before / after NFC
    std::vector<std::string> piece;                      // id -> bytes it decodes to
    std::vector<uint8_t> has_token, is_special;          // per id
    int32_t byte_id[256];                                // id of each single-byte symbol, or -1
    uint32_t byte_char[256];                             // GPT-2 bytes_to_unicode
    int32_t n_vocab = 0;
    bool nfc = false, ignore_merges = false, fuse_unk = false;
    int32_t unk_id = -1;
    dllm__pretok_kind pretok = DLLM__PRETOK_QWEN2;
    dllm_chat_template chat = DLLM_CHAT_NONE;
    std::string bos_token;  // for the LLaDA template
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // pre-token bytes -> ids
};
namespace {

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes map to
 * U+0100.. in increasing order, so every byte is a visible character in vocab strings. */
static void dllm__byte_chars(uint32_t out[256]) {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        out[b] = printable ? b : next++;
    }
}

/* The bytes a token string stands for, by HF's ByteLevel decoder: each character through the inverse
 * byte map, or, if any character is outside it, the token's own UTF-8. */
static std::string dllm__token_bytes(const dllm_tokenizer &t, const std::string &token) {
    std::vector<uint32_t> cps;
    dllm__utf8_decode(token, cps);
    std::string bytes;
    for (uint32_t cp : cps) {
        const uint32_t *hit = cp < 324 ? std::find(t.byte_char, t.byte_char + 256, cp) : t.byte_char + 256;
        if (hit == t.byte_char + 256) return token;
        bytes += (char)(hit - t.byte_char);
    }
    return bytes;
}

/* BPE of one pre-token (raw bytes), as HF's Word::merge_all: repeatedly apply the lowest-ranked merge,
 * leftmost first among equal ranks, with a heap of candidate pairs that are re-checked when popped. */
static void dllm__bpe_merge(const dllm_tokenizer &t, const std::string &bytes, std::vector<int32_t> &out) {
    struct symbol {
        int32_t id;
        int prev, next;
    };
    std::vector<symbol> sym;
    for (unsigned char b : bytes) {
        int32_t id = t.byte_id[b];
        if (id < 0) {  // a byte the vocabulary lacks: HF uses unk (fused if asked) or drops it
            if (t.unk_id < 0 || (t.fuse_unk && !sym.empty() && sym.back().id == t.unk_id)) continue;
            id = t.unk_id;
        }
        sym.push_back({id, (int)sym.size() - 1, (int)sym.size() + 1});
    }
    if (sym.empty()) return;
    sym.back().next = -1;
    struct cand {
        int32_t rank;
        int pos;
        int32_t merged;
    };
    auto later = [](const cand &a, const cand &b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
    std::vector<cand> heap;
    auto push = [&](int pos) {
        int next = sym[(size_t)pos].next;
        if (next < 0) return;
        auto it = t.merges.find((uint64_t)(uint32_t)sym[(size_t)pos].id << 32 | (uint32_t)sym[(size_t)next].id);
        if (it == t.merges.end()) return;
        heap.push_back({it->second.first, pos, it->second.second});
        std::push_heap(heap.begin(), heap.end(), later);
    };
    for (int i = 0; i + 1 < (int)sym.size(); i++) push(i);
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), later);
        cand top = heap.back();
        heap.pop_back();
        symbol &left = sym[(size_t)top.pos];
        if (left.id < 0 || left.next < 0) continue;  // merged away, or now the last symbol
        auto it = t.merges.find((uint64_t)(uint32_t)left.id << 32 | (uint32_t)sym[(size_t)left.next].id);
        if (it == t.merges.end() || it->second.second != top.merged) continue;  // stale candidate
        symbol &right = sym[(size_t)left.next];
        left.id = top.merged;
        left.next = right.next;
        right.id = -1;
        if (left.next >= 0) sym[(size_t)left.next].prev = top.pos;
        if (left.prev >= 0) push(left.prev);
        push(top.pos);
    }
    for (const symbol &s : sym)
        if (s.id >= 0) out.push_back(s.id);
}

/* Ids of one pre-token, through the encode cache. */
static void dllm__bpe(const dllm_tokenizer &t, const std::string &bytes, std::vector<int32_t> &out) {
    bool cacheable = bytes.size() <= DLLM__BPE_CACHE_PIECE;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(t.cache_mutex);
        auto it = t.cache.find(bytes);
        if (it != t.cache.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    std::vector<int32_t> ids;
    if (t.ignore_merges) {  // Llama-3: a pre-token that is a whole vocabulary entry is not merged
        std::string mapped;
        for (unsigned char b : bytes) dllm__utf8_put(mapped, t.byte_char[b]);
        auto it = t.vocab.find(mapped);
        if (it != t.vocab.end()) ids.push_back(it->second);
    }
    if (ids.empty()) dllm__bpe_merge(t, bytes, ids);
    out.insert(out.end(), ids.begin(), ids.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(t.cache_mutex);
        if (t.cache.size() < DLLM__BPE_CACHE_MAX) t.cache.emplace(bytes, std::move(ids));
    }
}

/* The start of the run of whitespace that ends text[0..end). */
static size_t dllm__space_before(const std::string &text, size_t end) {
    while (end > 0) {
        size_t k = end - 1;
        while (k > 0 && ((unsigned char)text[k] & 0xC0) == 0x80) k--;
        uint32_t cp;
        dllm__utf8_next((const uint8_t *)text.data() + k, end - k, cp);
        if (!dllm__is_space(cp)) break;
        end = k;
    }
    return end;
}

/* The end of the run of whitespace that starts at text[begin]. */
static size_t dllm__space_after(const std::string &text, size_t begin) {
    while (begin < text.size()) {
        uint32_t cp;
        size_t len = dllm__utf8_next((const uint8_t *)text.data() + begin, text.size() - begin, cp);
        if (!dllm__is_space(cp)) break;
        begin += len;
    }
    return begin;
}

struct dllm__span {
    int32_t id;  // an added token, or -1 for text still to tokenize
    size_t begin, end;
};

/* HF's AddedVocabulary::find_matches: added tokens cut out of text, with lstrip/rstrip taking the
 * whitespace beside them. A special token skipped because parse_special is off is still consumed by
 * the matcher, as HF's encode_special_tokens does, so no token is found inside it. */
static void dllm__split_added(const dllm_tokenizer &t, const dllm__trie &trie, const std::string &text,
                              bool parse_special, std::vector<dllm__span> &out) {
    size_t done = 0;  // text before this is already in out
    for (size_t pos = 0; pos < text.size();) {
        size_t len = 0;
        int32_t k = trie.longest(text, pos, len);
        if (k < 0) {
            pos++;
            continue;
        }
        const dllm__added_token &a = t.added[(size_t)k];
        size_t begin = pos, end = pos + len;
        pos = end;
        if (a.special && !parse_special) continue;
        if (a.lstrip) begin = std::max(dllm__space_before(text, begin), done);
        if (a.rstrip) pos = end = dllm__space_after(text, end);
        if (begin > done) out.push_back({-1, done, begin});
        out.push_back({a.id, begin, end});
        done = end;
    }
    if (done < text.size()) out.push_back({-1, done, text.size()});
}

/* Pre-tokenizes and BPE-encodes normalised text that holds no added token. */
static void dllm__encode_plain(const dllm_tokenizer &t, const std::string &text, std::vector<int32_t> &out) {
    std::vector<std::pair<size_t, size_t>> pieces;
    dllm__pretokenize(t.pretok, text, pieces);
    for (const auto &p : pieces) dllm__bpe(t, text.substr(p.first, p.second - p.first), out);
}

/* The whole encode pipeline of HF's TokenizerImpl::encode, without post-processing (no BOS/EOS). */
static void dllm__tokenize(const dllm_tokenizer &t, const char *data, size_t n, bool parse_special,
                           std::vector<int32_t> &out) {
    std::string text = dllm__utf8_sanitize(data, n);
    std::vector<dllm__span> spans;
    dllm__split_added(t, t.raw_trie, text, parse_special, spans);
    for (const dllm__span &s : spans) {
        if (s.id >= 0) {
            out.push_back(s.id);
            continue;
        }
        std::string gap = text.substr(s.begin, s.end - s.begin);
        if (t.nfc) gap = dllm__nfc(gap);
        std::vector<dllm__span> inner;  // tokens with normalized: true match the normalised text
        dllm__split_added(t, t.normalized_trie, gap, parse_special, inner);
        for (const dllm__span &g : inner) {
            if (g.id >= 0)
                out.push_back(g.id);
            else
                dllm__encode_plain(t, gap.substr(g.begin, g.end - g.begin), out);
        }
    }
}

/* HF's decode: token bytes concatenated (special tokens skipped if asked), then UTF-8 with U+FFFD
 * replacement over the whole byte string, so characters split across tokens survive. */
static dllm_status dllm__detokenize(const dllm_tokenizer &t, const int32_t *ids, int n_ids, bool skip_special,
                                    std::string &out) {
    std::string bytes;
    for (int i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t.n_vocab || !t.has_token[(size_t)id])
            return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                              "ids[%d] = %d is not a token of this tokenizer (vocabulary of %d)", i, id, t.n_vocab);
        if (!(skip_special && t.is_special[(size_t)id])) bytes += t.piece[(size_t)id];
    }
    out = dllm__utf8_sanitize(bytes.data(), bytes.size());
    return DLLM_OK;
}
