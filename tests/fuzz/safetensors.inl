/* safetensors: dllm__st_open on arbitrary bytes written as a file, mapped or read (by the input's
 * parity). An accepted file must be tiled exactly by its tensors, every byte of which is read here so
 * that AddressSanitizer sees any pointer outside the file. */

static int fuzz_safetensors(const uint8_t *data, size_t n) {
    fuzz_write("model.safetensors", data, n);
    dllm__safetensors st;
    dllm_status s = dllm__st_open(fuzz_path("model.safetensors"), n % 2 == 0, st);
    if (s != DLLM_OK) {
        FUZZ_CHECK(s == DLLM_ERR_FORMAT && strstr(dllm_last_error(), "model.safetensors"));
        return 0;
    }
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | data[i];
    size_t covered = 0;
    unsigned sum = 0;
    for (const dllm__tensor &t : st.tensors) {
        FUZZ_CHECK(t.file == &st.file->path && t.numel >= 0);
        FUZZ_CHECK((uint64_t)t.numel * (uint64_t)dllm__dtypes[t.dtype].bits == (uint64_t)t.nbytes * 8);
        for (size_t i = 0; i < t.nbytes; i++) sum += t.data[i];
        if (t.dtype == DLLM__BF16 || t.dtype == DLLM__F16 || t.dtype == DLLM__F32)
            for (int64_t i = 0; i < t.numel; i++) sum += std::isnan(dllm__tensor_at(t, i));
        covered += t.nbytes;
    }
    FUZZ_CHECK(covered == n - 8 - header);
    return (int)(sum & 0);
}
