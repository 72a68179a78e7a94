/* src/tokenizer/pretokenize.cpp - the pre-tokenizer split regexes as scanners. */

// ---- Pre-tokenizer: the split regexes, as scanners --------------------------------------------------
// HF runs these patterns with Oniguruma: at each position the alternatives are tried left to right and
// the first that matches wins (not the longest); matches never overlap. The Ling pattern differs from
// Qwen2's only in spelling (possessive quantifiers and `\s*[\r\n]` give the same matches here), and every
// code point is a letter, a number, whitespace or "other", so the alternatives always cover the text.

enum dllm__pretok_kind { DLLM__PRETOK_GPT2, DLLM__PRETOK_LLAMA3, DLLM__PRETOK_QWEN2, DLLM__PRETOK_LING };

static const struct {
    dllm__pretok_kind kind;
    const char *regex;  // exactly as in tokenizer.json, after JSON unescaping
} dllm__pretok_patterns[] = {
    {DLLM__PRETOK_GPT2, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_LLAMA3,
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_QWEN2,
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {DLLM__PRETOK_LING,
     "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|"
     "\\s+(?!\\S)|\\s+"},
};

/* Does c (at i) match the ASCII letter `lower`, case-insensitively if asked? Oniguruma folds case
 * with Unicode's CaseFolding, where U+017F LATIN SMALL LETTER LONG S folds to 's'. */
static bool dllm__ci_letter(const std::vector<uint32_t> &c, size_t i, char lower, bool ignore_case) {
    if (i >= c.size()) return false;
    if (c[i] == (uint32_t)lower) return true;
    return ignore_case && (c[i] == (uint32_t)(lower - 32) || (lower == 's' && c[i] == 0x17F));
}

/* Length of the contraction suffix ('s 't 're 've 'm 'll 'd without the apostrophe) at c[i], or 0. */
static size_t dllm__contraction(const std::vector<uint32_t> &c, size_t i, bool ic) {
    for (char one : {'s', 't', 'm', 'd'})
        if (dllm__ci_letter(c, i, one, ic)) return 1;
    static const char two[][3] = {"re", "ve", "ll"};
    for (const char *t : two)
        if (dllm__ci_letter(c, i, t[0], ic) && dllm__ci_letter(c, i + 1, t[1], ic)) return 2;
    return 0;
}

/* The end of the pre-token that starts at c[i]. */
static size_t dllm__pretok_next(dllm__pretok_kind kind, const std::vector<uint32_t> &c, size_t i) {
    const size_t n = c.size();
    const bool gpt2 = kind == DLLM__PRETOK_GPT2;
    auto letter = [&](size_t k) { return k < n && dllm__is_letter(c[k]); };
    auto number = [&](size_t k) { return k < n && dllm__is_number(c[k]); };
    auto space = [&](size_t k) { return k < n && dllm__is_space(c[k]); };
    auto other = [&](size_t k) {
        return k < n && !dllm__is_letter(c[k]) && !dllm__is_number(c[k]) && !dllm__is_space(c[k]);
    };
    auto newline = [&](size_t k) { return k < n && (c[k] == '\r' || c[k] == '\n'); };
    auto run = [&](size_t k, const auto &in) {
        while (in(k)) k++;
        return k;
    };

    if (c[i] == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d, case-insensitive except in GPT-2's pattern
        size_t len = dllm__contraction(c, i + 1, !gpt2);
        if (len) return i + 1 + len;
    }
    if (gpt2) {  // ' ?\p{L}+| ?\p{N}+'
        size_t j = i + (c[i] == ' ');
        if (letter(j)) return run(j, letter);
        if (number(j)) return run(j, number);
    } else {  // '[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}' (Llama-3) or '|\p{N}' (Qwen2, Ling)
        if (letter(i)) return run(i, letter);
        if (!newline(i) && !number(i) && letter(i + 1)) return run(i + 1, letter);
        if (number(i)) {
            size_t max_digits = kind == DLLM__PRETOK_LLAMA3 ? 3 : 1, k = i;
            while (k - i < max_digits && number(k)) k++;
            return k;
        }
    }
    size_t j = i + (c[i] == ' ');  // ' ?[^\s\p{L}\p{N}]+', then '[\r\n]*' except in GPT-2's pattern
    if (other(j)) {
        size_t k = run(j, other);
        return gpt2 ? k : run(k, newline);
    }
    // c[i] is whitespace. '\s*[\r\n]+' ends at the last newline of the run (greedy \s* backtracks to it).
    size_t end = run(i, space);
    if (!gpt2)
        for (size_t k = end; k > i; k--)
            if (newline(k - 1)) return k;
    // '\s+(?!\S)' keeps the whole run at the end of the text, else leaves its last character to the
    // next token (when that leaves nothing, '\s+' takes the single character).
    return end == n || end - i == 1 ? end : end - 1;
}

/* Splits NFC'd text into pre-tokens (byte ranges). */
static void dllm__pretokenize(dllm__pretok_kind kind, const std::string &text,
                              std::vector<std::pair<size_t, size_t>> &out) {
    std::vector<uint32_t> c;
    dllm__utf8_decode(text, c);
    std::vector<size_t> offset(c.size() + 1, 0);
    for (size_t i = 0; i < c.size(); i++)
        offset[i + 1] = offset[i] + (c[i] < 0x80 ? 1 : c[i] < 0x800 ? 2 : c[i] < 0x10000 ? 3 : 4);
    for (size_t i = 0; i < c.size();) {
        size_t end = dllm__pretok_next(kind, c, i);
        out.push_back({offset[i], offset[end]});
        i = end;
    }
}
