/* json: dllm__json_parse on arbitrary bytes. A parsed document is written back out and parsed again:
 * both parses must give the same tree (strings byte for byte, integers exactly, doubles bit for bit). */

static void fuzz_json_write(const dllm__json &v, std::string &out) {
    switch (v.kind) {
        case dllm__json::NUL: out += "null"; break;
        case dllm__json::BOOL: out += v.boolean ? "true" : "false"; break;
        case dllm__json::NUM:
            if (v.is_integer) out += std::to_string(v.integer);
            else if (std::isinf(v.number)) out += v.number > 0 ? "1e999" : "-1e999";
            else {
                std::string num = dllm__format("%.17g", v.number);  // shortest exact form; keep it non-integral
                out += num + (num.find_first_of(".e") == std::string::npos ? ".0" : "");
            }
            break;
        case dllm__json::STR:
            out += '"';
            for (unsigned char ch : v.str) {
                if (ch == '"' || ch == '\\') out += '\\', out += (char)ch;
                else if (ch < 0x20) out += dllm__format("\\u%04x", ch);
                else out += (char)ch;
            }
            out += '"';
            break;
        case dllm__json::ARR:
        case dllm__json::OBJ:
            out += v.kind == dllm__json::ARR ? '[' : '{';
            for (size_t i = 0; i < v.items.size(); i++) {
                if (i) out += ',';
                if (v.kind == dllm__json::OBJ) {
                    dllm__json key;
                    key.kind = dllm__json::STR;
                    key.str = v.keys[i];
                    fuzz_json_write(key, out);
                    out += ':';
                }
                fuzz_json_write(v.items[i], out);
            }
            out += v.kind == dllm__json::ARR ? ']' : '}';
            break;
    }
}

static bool fuzz_json_same(const dllm__json &a, const dllm__json &b) {
    if (a.kind != b.kind || a.keys != b.keys || a.items.size() != b.items.size()) return false;
    switch (a.kind) {
        case dllm__json::BOOL: return a.boolean == b.boolean;
        case dllm__json::NUM:
            return a.is_integer == b.is_integer &&
                   (a.is_integer ? a.integer == b.integer : memcmp(&a.number, &b.number, sizeof a.number) == 0);
        case dllm__json::STR: return a.str == b.str;
        default: break;
    }
    for (size_t i = 0; i < a.items.size(); i++)
        if (!fuzz_json_same(a.items[i], b.items[i])) return false;
    return true;
}

static int fuzz_json(const uint8_t *data, size_t n) {
    dllm__json v;
    dllm_status st = dllm__json_parse((const char *)data, n, "input", v);
    if (st != DLLM_OK) {
        FUZZ_CHECK(st == DLLM_ERR_FORMAT && strstr(dllm_last_error(), "input: invalid JSON"));
        return 0;
    }
    std::string text;
    fuzz_json_write(v, text);
    dllm__json again;
    FUZZ_CHECK(dllm__json_parse(text.data(), text.size(), "rewritten", again) == DLLM_OK);
    FUZZ_CHECK(fuzz_json_same(v, again));
    return 0;
}
