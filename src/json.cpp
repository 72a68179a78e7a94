/* src/json.cpp - a strict JSON parser (config.json, tokenizer.json, safetensors headers). */

// ---------------------------------------------------------------------------------------------------
// 2. JSON parser
//    A small strict DOM parser (RFC 8259): config files, safetensors headers, shard indexes and
//    tokenizer files. Depth is bounded so a malicious file cannot exhaust the stack.
// ---------------------------------------------------------------------------------------------------

struct dllm__json {
    enum kind_t : uint8_t { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    bool boolean = false;
    bool is_integer = false;  // the number was written without fraction/exponent and fits int64
    int64_t integer = 0;
    double number = 0;
    std::string str;
    std::vector<std::string> keys;  // OBJ: member names, parallel to items
    std::vector<dllm__json> items;  // ARR: elements; OBJ: member values

    const dllm__json *find(const char *key) const {
        if (kind != OBJ) return nullptr;
        for (size_t i = 0; i < keys.size(); i++)
            if (keys[i] == key) return &items[i];
        return nullptr;
    }
    bool is_null() const { return kind == NUL; }
};

struct dllm__json_parser {
    const char *begin, *p, *end;
    std::string error;
    enum { max_depth = 64 };

    bool fail(const char *what) {
        if (error.empty()) error = dllm__format("%s at byte %lld", what, (long long)(p - begin));
        return false;
    }
    /* Consumes c when it is the next byte: the separators and closing brackets of objects and arrays. */
    bool eat(char c) {
        if (p >= end || *p != c) return false;
        p++;
        return true;
    }
    void skip_ws() {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    }
    bool literal(const char *word) {
        size_t n = strlen(word);
        if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return fail("invalid literal");
        p += n;
        return true;
    }
    static void put_utf8(std::string &s, uint32_t cp) {
        if (cp < 0x80) {
            s += (char)cp;
        } else if (cp < 0x800) {
            s += (char)(0xC0 | (cp >> 6));
            s += (char)(0x80 | (cp & 63));
        } else if (cp < 0x10000) {
            s += (char)(0xE0 | (cp >> 12));
            s += (char)(0x80 | ((cp >> 6) & 63));
            s += (char)(0x80 | (cp & 63));
        } else {
            s += (char)(0xF0 | (cp >> 18));
            s += (char)(0x80 | ((cp >> 12) & 63));
            s += (char)(0x80 | ((cp >> 6) & 63));
            s += (char)(0x80 | (cp & 63));
        }
    }
    bool hex4(uint32_t &v) {
        if (end - p < 4) return fail("truncated \\u escape");
        v = 0;
        for (int i = 0; i < 4; i++) {
            char c = *p++;
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= (uint32_t)(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= (uint32_t)(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= (uint32_t)(c - 'A' + 10);
            else
                return fail("bad hex digit in \\u escape");
        }
        return true;
    }
    bool string(std::string &s) {
        p++;  // opening quote
        while (true) {
            const char *run = p;
            while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20) p++;
            s.append(run, (size_t)(p - run));
            if (p >= end) return fail("unterminated string");
            char c = *p;
            if (c == '"') {
                p++;
                return true;
            }
            if ((unsigned char)c < 0x20) return fail("control character in string");
            p++;  // backslash
            if (p >= end) return fail("unterminated escape");
            char e = *p++;
            switch (e) {
                case '"': s += '"'; break;
                case '\\': s += '\\'; break;
                case '/': s += '/'; break;
                case 'b': s += '\b'; break;
                case 'f': s += '\f'; break;
                case 'n': s += '\n'; break;
                case 'r': s += '\r'; break;
                case 't': s += '\t'; break;
                case 'u': {
                    uint32_t cp;
                    if (!hex4(cp)) return false;
                    if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                        const char *save = p;
                        p += 2;
                        uint32_t lo;
                        if (!hex4(lo)) return false;
                        if (lo >= 0xDC00 && lo < 0xE000)
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                        else {
                            p = save;
                            cp = 0xFFFD;
                        }
                    } else if (cp >= 0xD800 && cp < 0xE000) {
                        cp = 0xFFFD;  // lone surrogate: not representable in UTF-8
                    }
                    put_utf8(s, cp);
                    break;
                }
                default: return fail("invalid escape");
            }
        }
    }
    bool number(dllm__json &v) {
        const char *start = p;
        bool integral = true;
        if (p < end && *p == '-') p++;
        if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
        if (*p == '0')
            p++;
        else
            while (p < end && *p >= '0' && *p <= '9') p++;
        if (p < end && *p == '.') {
            integral = false;
            p++;
            if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            integral = false;
            p++;
            if (p < end && (*p == '+' || *p == '-')) p++;
            if (p >= end || !(*p >= '0' && *p <= '9')) return fail("invalid number");
            while (p < end && *p >= '0' && *p <= '9') p++;
        }
        std::string text(start, (size_t)(p - start));
        v.kind = dllm__json::NUM;
        v.number = strtod(text.c_str(), nullptr);
        if (integral) {
            errno = 0;
            long long ll = strtoll(text.c_str(), nullptr, 10);
            if (errno == 0) {
                v.is_integer = true;
                v.integer = ll;
            }
        }
        return true;
    }
    bool value(dllm__json &v, int depth) {
        if (depth > max_depth) return fail("nesting too deep");
        skip_ws();
        if (p >= end) return fail("unexpected end of input");
        switch (*p) {
            case '{': {
                v.kind = dllm__json::OBJ;
                p++;
                skip_ws();
                if (eat('}')) return true;
                do {
                    skip_ws();
                    if (p >= end || *p != '"') return fail("expected a member name");
                    v.keys.emplace_back();
                    if (!string(v.keys.back())) return false;
                    skip_ws();
                    if (!eat(':')) return fail("expected ':'");
                    v.items.emplace_back();
                    if (!value(v.items.back(), depth + 1)) return false;
                    skip_ws();
                } while (eat(','));
                return eat('}') || fail("expected ',' or '}'");
            }
            case '[': {
                v.kind = dllm__json::ARR;
                p++;
                skip_ws();
                if (eat(']')) return true;
                do {
                    v.items.emplace_back();
                    if (!value(v.items.back(), depth + 1)) return false;
                    skip_ws();
                } while (eat(','));
                return eat(']') || fail("expected ',' or ']'");
            }
            case '"': v.kind = dllm__json::STR; return string(v.str);
            case 't':
                v.kind = dllm__json::BOOL;
                v.boolean = true;
                return literal("true");
            case 'f':
                v.kind = dllm__json::BOOL;
                v.boolean = false;
                return literal("false");
            case 'n': v.kind = dllm__json::NUL; return literal("null");
            default: return number(v);
        }
    }
};

/* Parses text[0..size) into out; on failure returns DLLM_ERR_FORMAT naming `what` (usually a path). */
static dllm_status dllm__json_parse(const char *text, size_t size, const std::string &what, dllm__json &out) {
    dllm__json_parser ps{text, text, text + size, std::string()};
    out = dllm__json();
    if (!ps.value(out, 0)) return dllm__fail(DLLM_ERR_FORMAT, "%s: invalid JSON: %s", what.c_str(), ps.error.c_str());
    ps.skip_ws();
    if (ps.p != ps.end)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: invalid JSON: trailing data at byte %lld", what.c_str(),
                          (long long)(ps.p - text));
    return DLLM_OK;
}

static dllm_status dllm__json_load(const std::string &path, dllm__json &out) {
    std::string text;
    DLLM__TRY(dllm__read_text(path, text));
    return dllm__json_parse(text.data(), text.size(), path, out);
}
