/* src/tokenizer/normalize.cpp - NFC normalisation (UAX #15). */

// ---- NFC (UAX #15: canonical decomposition, canonical ordering, canonical composition) ---------------

enum {
    DLLM__HANGUL_S = 0xAC00,
    DLLM__HANGUL_L = 0x1100,
    DLLM__HANGUL_V = 0x1161,
    DLLM__HANGUL_T = 0x11A7,
    DLLM__HANGUL_V_COUNT = 21,
    DLLM__HANGUL_T_COUNT = 28,
    DLLM__HANGUL_N = 21 * 28,
    DLLM__HANGUL_COUNT = 19 * 21 * 28
};

struct dllm__nfc_tables {
    std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomp;  // code point -> (first, second or 0)
    std::unordered_map<uint64_t, uint32_t> compose;                      // (first << 32 | second) -> composite

    dllm__nfc_tables() {
        const size_t n = sizeof(dllm__uc_decomp) / sizeof(dllm__uc_decomp[0]);
        for (size_t i = 0; i < n; i += 3) {
            uint32_t cp = dllm__uc_decomp[i] & 0x7FFFFFFFu, a = dllm__uc_decomp[i + 1], b = dllm__uc_decomp[i + 2];
            bool excluded = (dllm__uc_decomp[i] >> 31) != 0;
            decomp[cp] = {a, b};
            if (!excluded && b) compose[(uint64_t)a << 32 | b] = cp;
        }
    }
};

static const dllm__nfc_tables &dllm__nfc_data() {
    static const dllm__nfc_tables tables;  // built once, thread-safe (C++11 static initialisation)
    return tables;
}

static void dllm__decompose(uint32_t cp, std::vector<uint32_t> &out) {
    if (cp >= DLLM__HANGUL_S && cp < DLLM__HANGUL_S + DLLM__HANGUL_COUNT) {
        uint32_t s = cp - DLLM__HANGUL_S;
        out.push_back(DLLM__HANGUL_L + s / DLLM__HANGUL_N);
        out.push_back(DLLM__HANGUL_V + (s % DLLM__HANGUL_N) / DLLM__HANGUL_T_COUNT);
        if (s % DLLM__HANGUL_T_COUNT) out.push_back(DLLM__HANGUL_T + s % DLLM__HANGUL_T_COUNT);
        return;
    }
    const auto &d = dllm__nfc_data().decomp;
    auto it = cp < 0xC0 ? d.end() : d.find(cp);
    if (it == d.end()) {
        out.push_back(cp);
        return;
    }
    dllm__decompose(it->second.first, out);
    if (it->second.second) dllm__decompose(it->second.second, out);
}

static uint32_t dllm__compose_pair(uint32_t a, uint32_t b) {
    if (a >= DLLM__HANGUL_L && a < DLLM__HANGUL_L + 19 && b >= DLLM__HANGUL_V &&
        b < DLLM__HANGUL_V + DLLM__HANGUL_V_COUNT)
        return DLLM__HANGUL_S +
               ((a - DLLM__HANGUL_L) * DLLM__HANGUL_V_COUNT + (b - DLLM__HANGUL_V)) * DLLM__HANGUL_T_COUNT;
    if (a >= DLLM__HANGUL_S && a < DLLM__HANGUL_S + DLLM__HANGUL_COUNT &&
        (a - DLLM__HANGUL_S) % DLLM__HANGUL_T_COUNT == 0 && b > DLLM__HANGUL_T &&
        b < DLLM__HANGUL_T + DLLM__HANGUL_T_COUNT)
        return a + (b - DLLM__HANGUL_T);
    const auto &c = dllm__nfc_data().compose;
    auto it = c.find((uint64_t)a << 32 | b);
    return it == c.end() ? 0 : it->second;
}

/* NFC of valid UTF-8. Text that is all ASCII is already NFC. */
static std::string dllm__nfc(const std::string &text) {
    bool ascii = true;
    for (char ch : text) ascii = ascii && (unsigned char)ch < 0x80;
    if (ascii) return text;
    std::vector<uint32_t> cps, d;
    dllm__utf8_decode(text, cps);
    for (uint32_t cp : cps) dllm__decompose(cp, d);
    // Canonical ordering: a stable sort of each run of non-starters by combining class.
    for (size_t i = 1; i < d.size(); i++) {
        int c = dllm__ccc(d[i]);
        for (size_t j = i; c && j > 0 && dllm__ccc(d[j - 1]) > c; j--) std::swap(d[j - 1], d[j]);
    }
    // Canonical composition (the reference algorithm of UAX #15): a character joins the last starter
    // unless a character of equal or higher class stands between them; 256 blocks a leading non-starter.
    if (d.empty()) return std::string();
    size_t starter = 0, kept = 1;
    int last_class = dllm__ccc(d[0]) ? 256 : 0;
    for (size_t i = 1; i < d.size(); i++) {
        int c = dllm__ccc(d[i]);
        uint32_t composite = last_class < c || last_class == 0 ? dllm__compose_pair(d[starter], d[i]) : 0;
        if (composite) {
            d[starter] = composite;
            continue;
        }
        if (c == 0) starter = kept;
        last_class = c;
        d[kept++] = d[i];
    }
    return dllm__utf8_encode(d.data(), kept);
}
