/* st_index: a model.safetensors.index.json through dllm__load_sharded, beside two valid shards
 * ("a.safetensors" holds tensors x and y, "b.safetensors" holds z): an accepted index maps every tensor
 * it names to the shard that holds it. */

static void fuzz_st_index_init() {
    fuzz_make_dir();
    auto shard = [](const char *name, const std::vector<std::string> &tensors) {
        std::string header = "{";
        for (size_t i = 0; i < tensors.size(); i++)
            header += dllm__format("%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%zu,%zu]}",
                                   i ? "," : "", tensors[i].c_str(), 8 * i, 8 * i + 8);
        header += "}";
        std::string bytes(8, '\0');
        for (int i = 0; i < 8; i++) bytes[(size_t)i] = (char)((header.size() >> (8 * i)) & 0xFF);
        fuzz_write(name, bytes + header + std::string(8 * tensors.size(), '\x01'));
    };
    shard("a.safetensors", {"x", "y"});
    shard("b.safetensors", {"z"});
}

static int fuzz_st_index(const uint8_t *data, size_t n) {
    fuzz_write("model.safetensors.index.json", data, n);
    dllm_model m;
    m.dir = fuzz_dir;
    dllm_status s = dllm__load_sharded(m, fuzz_path("model.safetensors.index.json"), n % 2 == 0);
    if (s != DLLM_OK) {
        FUZZ_CHECK(s == DLLM_ERR_FORMAT || s == DLLM_ERR_IO);
        return 0;
    }
    FUZZ_CHECK(m.files.size() <= 2 && m.by_name.size() <= 3);
    for (const auto &kv : m.by_name) FUZZ_CHECK(kv.second->nbytes == 8 && kv.second->data[7] == 1);
    return 0;
}
