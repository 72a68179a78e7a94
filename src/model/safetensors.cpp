/* src/model/safetensors.cpp - the safetensors reader: single files and sharded indexes, memory-mapped. */

// ---------------------------------------------------------------------------------------------------
// 3. safetensors reader
//    Layout: u64 LE header length N, N bytes of JSON, then the data buffer. Validation follows the
//    reference reader: header bound, JSON object, known dtypes, byte counts that match the shape,
//    offsets contiguous from 0 with no gap or overlap and ending exactly at the end of the file.
// ---------------------------------------------------------------------------------------------------

enum dllm__dtype {
    DLLM__BOOL,
    DLLM__U8,
    DLLM__I8,
    DLLM__F8_E5M2,
    DLLM__F8_E4M3,
    DLLM__F8_E8M0,
    DLLM__F4,
    DLLM__F6_E2M3,
    DLLM__F6_E3M2,
    DLLM__I16,
    DLLM__U16,
    DLLM__F16,
    DLLM__BF16,
    DLLM__I32,
    DLLM__U32,
    DLLM__F32,
    DLLM__F64,
    DLLM__I64,
    DLLM__U64,
    DLLM__C64,
    DLLM__DTYPE_COUNT
};

static const struct {
    const char *name;
    int bits;
} dllm__dtypes[DLLM__DTYPE_COUNT] = {
    {"BOOL", 8},    {"U8", 8},      {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F4", 4},
    {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"I16", 16}, {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},
    {"U32", 32},    {"F32", 32},    {"F64", 64}, {"I64", 64},    {"U64", 64},    {"C64", 64},
};

struct dllm__tensor {
    std::string name;
    dllm__dtype dtype = DLLM__F32;
    std::vector<int64_t> shape;
    int64_t numel = 1;
    const uint8_t *data = nullptr;
    size_t nbytes = 0;
    const std::string *file = nullptr;  // path of the file holding it
};

struct dllm__safetensors {
    std::unique_ptr<dllm__file> file;
    std::vector<dllm__tensor> tensors;
    std::vector<std::vector<uint8_t>> realigned;                // copies of tensors whose mapped bytes were misaligned
    std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__ (string values), in file order
};

static const uint64_t dllm__st_max_header = 100000000;

static dllm_status dllm__st_parse_entry(const std::string &path, const std::string &name, const dllm__json &e,
                                        dllm__tensor &t, uint64_t &begin, uint64_t &end) {
    const char *p = path.c_str(), *n = name.c_str();
    if (e.kind != dllm__json::OBJ)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: entry is not a JSON object", p, n);
    const dllm__json *dt = e.find("dtype"), *sh = e.find("shape"), *off = e.find("data_offsets");
    if (!dt || dt->kind != dllm__json::STR) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: missing dtype", p, n);
    int dtype = -1;
    for (int i = 0; i < DLLM__DTYPE_COUNT; i++)
        if (dt->str == dllm__dtypes[i].name) dtype = i;
    if (dtype < 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\"", p, n, dt->str.c_str());
    if (!sh || sh->kind != dllm__json::ARR) return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: missing shape", p, n);
    if (!off || off->kind != dllm__json::ARR || off->items.size() != 2)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets must be [begin, end]", p, n);
    t.name = name;
    t.dtype = (dllm__dtype)dtype;
    t.numel = 1;
    for (const dllm__json &d : sh->items) {
        if (!d.is_integer || d.integer < 0)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: shape entries must be non-negative integers", p, n);
        if (d.integer > 0 && t.numel > INT64_MAX / 64 / d.integer)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: shape overflows", p, n);
        t.shape.push_back(d.integer);
        t.numel *= d.integer;
    }
    for (const dllm__json &o : off->items)
        if (!o.is_integer || o.integer < 0)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets must be non-negative integers", p, n);
    begin = (uint64_t)off->items[0].integer;
    end = (uint64_t)off->items[1].integer;
    if (end < begin)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: data_offsets end %llu < begin %llu", p, n,
                          (unsigned long long)end, (unsigned long long)begin);
    uint64_t bits = (uint64_t)t.numel * (uint64_t)dllm__dtypes[dtype].bits;
    if (bits % 8 != 0 || end - begin != bits / 8)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s: %s %s needs %llu bytes but data_offsets span %llu", p, n,
                          dllm__dtypes[dtype].name, dllm__shape_str(t.shape).c_str(), (unsigned long long)(bits / 8),
                          (unsigned long long)(end - begin));
    t.nbytes = (size_t)(end - begin);
    return DLLM_OK;
}

static dllm_status dllm__st_open(const std::string &path, bool use_mmap, dllm__safetensors &st) {
    DLLM__TRY(dllm__open_file(path, use_mmap, st.file));
    const dllm__file &f = *st.file;
    const char *p = path.c_str();
    if (f.size < 8)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: file is %zu bytes, too short for the 8-byte header length", p, f.size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f.data[i];
    if (n > dllm__st_max_header)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: header length %llu exceeds the %llu-byte limit", p,
                          (unsigned long long)n, (unsigned long long)dllm__st_max_header);
    if (n > f.size - 8)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file (truncated?)",
                          p, (unsigned long long)n, f.size);
    const char *header = (const char *)f.data + 8;
    if (n == 0 || header[0] != '{') return dllm__fail(DLLM_ERR_FORMAT, "%s: header does not start with '{'", p);
    dllm__json root;
    DLLM__TRY(dllm__json_parse(header, (size_t)n, path + " (safetensors header)", root));
    if (root.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: header is not a JSON object", p);

    std::unordered_set<std::string> seen;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (begin, end) per tensor
    for (size_t i = 0; i < root.keys.size(); i++) {
        const std::string &name = root.keys[i];
        if (!seen.insert(name).second)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: duplicate entry \"%s\" in header", p, name.c_str());
        if (name == "__metadata__") {
            const dllm__json &m = root.items[i];
            if (m.kind != dllm__json::OBJ) return dllm__fail(DLLM_ERR_FORMAT, "%s: __metadata__ is not an object", p);
            for (const dllm__json &v : m.items)
                if (v.kind != dllm__json::STR)
                    return dllm__fail(DLLM_ERR_FORMAT, "%s: __metadata__ values must be strings", p);
            for (size_t k = 0; k < m.keys.size(); k++) st.metadata.push_back({m.keys[k], m.items[k].str});
            continue;
        }
        dllm__tensor t;
        uint64_t b = 0, e = 0;
        DLLM__TRY(dllm__st_parse_entry(path, name, root.items[i], t, b, e));
        st.tensors.push_back(std::move(t));
        ranges.push_back({b, e});
    }

    // Offsets must tile the data buffer exactly: sorted by begin, each starts where the last ended.
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    uint64_t expected = 0;
    for (size_t k : order) {
        if (ranges[k].first != expected)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s starts at data offset %llu, expected %llu (%s)", p,
                              st.tensors[k].name.c_str(), (unsigned long long)ranges[k].first,
                              (unsigned long long)expected, ranges[k].first < expected ? "overlap" : "gap");
        expected = ranges[k].second;
    }
    uint64_t data_size = f.size - 8 - n;
    if (expected != data_size)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: tensors cover %llu data bytes but the file holds %llu (%s)", p,
                          (unsigned long long)expected, (unsigned long long)data_size,
                          expected > data_size ? "truncated" : "trailing bytes");

    const uint8_t *base = f.data + 8 + n;
    for (size_t i = 0; i < st.tensors.size(); i++) {
        dllm__tensor &t = st.tensors[i];
        t.data = base + ranges[i].first;
        t.file = &st.file->path;
        size_t align = (size_t)std::max(1, dllm__dtypes[t.dtype].bits / 8);
        if (t.nbytes && ((uintptr_t)t.data % align) != 0) {  // some writers do not pad the header
            st.realigned.emplace_back(t.data, t.data + t.nbytes);
            t.data = st.realigned.back().data();
        }
    }
    return DLLM_OK;
}
