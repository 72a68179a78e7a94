/* src/gpu/weights.cpp - weights shared by the contexts of a device: kernel sets, uploads. */

// ---------------------------------------------------------------------------------------------------
// 16.2 [shared weights]
// ---------------------------------------------------------------------------------------------------

struct dllm__gpu_layer {
    dllm__linear qkv, o, gu, down;  // Q|K|V rows, the output projection, gate|up rows, down (empty in a MoE layer)
    dllm__dbuf attn_norm, ffn_norm, b_qkv;  // fp32
    // [MoE] LLaDA2: the QK-norm weights (fp32 [head_dim], empty without QK-norm); a MoE layer's router (bf16 [E x d]),
    // expert bias (fp32 [E]), each routed expert's gate|up rows and down, the shared expert's (empty without one)
    dllm__dbuf q_norm, k_norm, expert_bias;
    dllm__linear router, shared_gu, shared_down;
    std::vector<dllm__linear> expert_gu, expert_down;
};

/* The device weights of one model on one device in one set of weight formats. Immutable once built, so any number of
 * contexts on any threads read them at once; each context holds a reference and the last one frees them. */
struct dllm__gpu_weights {
    int device = 0;
    bool fp8_ffn = false, fp8_attn = false;  // [FP8] layers >= 1 store these linears as DLLM__W_E4M3_BLOCK
    dllm__soloq_options soloq;  // [SoloQ] enabled: every layer's linears (and the head if asked) are DLLM__W_Q4
    bool q4wg = false;  // [W4 GEMM] the layer linears q4wg takes are in its layout (dllm__gpu_layer_pack_q4wg)
    std::vector<dllm__gpu_layer> layers;
    dllm__dbuf embed;       // bf16 [vocab x d]: the embedding table
    dllm__linear head;      // the LM head; empty when tied to the embedding table
    dllm__dbuf final_norm;  // fp32 [d]
    size_t bytes = 0;       // device memory they take
    dllm__weight_view lm_head(const dllm__config &c) const {
        return head.data.ptr ? head.view() : dllm__weight_view{DLLM__W_BF16, c.n_vocab, c.n_embd, embed.ptr, nullptr};
    }
    /* [SoloQ] Whether a linear keeps its 4-bit codes in section 9b's rows (q4_gemm and the dequantising paths, which
     * need act_.q4w and act_.q4acc) rather than in q4wg's layout. */
    bool q4_rows_linears() const {
        auto rows = [](const dllm__linear &W) { return W.format == DLLM__W_Q4 && !W.q4->packed; };
        if (rows(head)) return true;
        for (const dllm__gpu_layer &G : layers)
            for (const dllm__linear *W : {&G.qkv, &G.o, &G.gu, &G.down, &G.shared_gu, &G.shared_down})
                if (rows(*W)) return true;  // [MoE] the shared expert keeps its rows (the routed experts need none)
        return false;
    }
};

/* The row-wise module's kernels (the table's rows), typed. */
struct dllm__rowwise_kernels {
#define DLLM__KERNEL_MEMBER(name, attrs, params) dllm__kernel<dllm__sig_##name> name;
    DLLM__ROWWISE_KERNELS(DLLM__KERNEL_MEMBER)
    DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_MEMBER)
};
struct dllm__sampler_kernels {
    DLLM__SAMPLER_KERNELS(DLLM__KERNEL_MEMBER)
};
struct dllm__soloq_kernels {
    DLLM__SOLOQ_KERNELS(DLLM__KERNEL_MEMBER)
    int max_smem = 0;       // dynamic shared memory a CTA may take here
    bool clusters = false;  // sm_90+: a row may be split over a cluster of CTAs (dllm__soloq_split)
};

/* Fills a typed kernel set from a loaded module, by the table's names. */
#define DLLM__KERNEL_BIND(kname, attrs, params) set.kname.fn = mod.kernels.at(#kname), set.kname.name = #kname;
static void dllm__bind(dllm__rowwise_kernels &set, dllm__module &mod) {
    DLLM__ROWWISE_KERNELS(DLLM__KERNEL_BIND)
    DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_BIND)
}
static void dllm__bind(dllm__sampler_kernels &set, dllm__module &mod) { DLLM__SAMPLER_KERNELS(DLLM__KERNEL_BIND) }
/* SoloQ's kernels, and the widest row soloq_quantize_rows takes with `smem_optin` bytes of shared memory a block. */
static dllm_status dllm__bind(dllm__soloq_kernels &set, dllm__module &mod, int smem_optin, int cc) {
    DLLM__SOLOQ_KERNELS(DLLM__KERNEL_BIND)
    const int dynamic = smem_optin - 1024;  // the kernel's static shared memory stays below 1 KB
    DLLM__CUDA(cudaFuncSetAttribute((const void *)set.soloq_quantize_rows.fn,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)set.soloq_produce_rows.fn,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic));
    set.max_smem = dynamic;
    set.clusters = cc >= 90;
    return DLLM_OK;
}

/* [FACache] on block diffusion: the layer-0 split attention (dllm__src_bdfa), loaded at its first use. */
struct dllm__bdfa_kernels {
    std::shared_ptr<dllm__module> module;
    DLLM__BDFA_KERNELS(DLLM__KERNEL_MEMBER)
};

static dllm__jit_request dllm__module_bdfa(const dllm__arch &arch) {
    static_assert(dllm__bdfa_warps * 32 == 256, "bdfa_committed's __launch_bounds__");
    return {
        "dllm_bdfa",
            dllm__src_prelude() + dllm__format("#define DLLM_BDFA_WARPS %d\n", dllm__bdfa_warps) +
                DLLM__XSTR(struct bdfa_args{DLLM__BDFA_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__BDFA_KERNELS(
                    DLLM__KERNEL_DECLARE) +
                dllm__src_warp_softmax + dllm__src_bdfa,
            {DLLM__BDFA_KERNELS(DLLM__KERNEL_NAME)}, arch.target
    };
}

/* [KV quant] The commit-time K/V quantisation kernels (dllm__src_kvq), loaded at a kv_quant context's first
 * generation. */
struct dllm__kvq_kernels {
    std::shared_ptr<dllm__module> module;
    DLLM__KVQ_KERNELS(DLLM__KERNEL_MEMBER)
};
/* kvq_tc (on by default): the tensor-core attention over the quantised cache (dllm__src_kvq_tc), a module per head
 * dim. */
struct dllm__kvq_tc_kernels {
    std::shared_ptr<dllm__module> module;
    DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_MEMBER)
#undef DLLM__KERNEL_MEMBER
    int hd = 0, smem_optin = 0;
};

static void dllm__bind(dllm__bdfa_kernels &set, dllm__module &mod) { DLLM__BDFA_KERNELS(DLLM__KERNEL_BIND) }
static void dllm__bind(dllm__kvq_kernels &set, dllm__module &mod) { DLLM__KVQ_KERNELS(DLLM__KERNEL_BIND) }
static void dllm__bind(dllm__kvq_tc_kernels &set, dllm__module &mod) { DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_BIND) }
#undef DLLM__KERNEL_BIND

static dllm_status dllm__upload_f32(dllm__dbuf &dst, const std::vector<float> &v, const char *what) {
    if (v.empty()) return DLLM_OK;
    DLLM__TRY(dst.fit(v.size() * 4, what));
    DLLM__CUDA(cudaMemcpy(dst.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return DLLM_OK;
}

/* Copies rows of host tensors (any float dtype) into one bf16 device weight [sum of rows x k], in order. */
static dllm_status dllm__upload_rows(dllm__linear &dst, std::initializer_list<const dllm__tensor *> parts,
                                     const char *what) {
    size_t n = 0;
    for (const dllm__tensor *t : parts) n += (size_t)t->numel;
    DLLM__TRY(dst.data.fit(n * 2, what));
    std::vector<uint16_t> host(n);
    size_t at = 0;
    for (const dllm__tensor *t : parts) {
        if (t->dtype == DLLM__BF16)
            memcpy(host.data() + at, t->data, t->nbytes);
        else
            for (int64_t i = 0; i < t->numel; i++) host[at + (size_t)i] = dllm__f32_to_bf16(dllm__tensor_at(*t, i));
        at += (size_t)t->numel;
    }
    DLLM__CUDA(cudaMemcpy(dst.data.ptr, host.data(), n * 2, cudaMemcpyHostToDevice));
    dst.format = DLLM__W_BF16;
    dst.k = (int)parts.begin()[0]->shape[1];
    dst.n = (int)(n / (size_t)dst.k);
    return DLLM_OK;
}

/* [non-finite weights] The first NaN or infinity of the bf16 weight uploaded from `parts` (a cheap device pass: a
 * damaged checkpoint is an error that names the tensor, never a model that silently decodes garbage). Twin:
 * dllm__first_nonfinite. */
static dllm_status dllm__check_finite(const dllm__linear &W, std::initializer_list<const dllm__tensor *> parts,
                                      const dllm__rowwise_kernels &k, cudaStream_t stream, dllm__dbuf &scratch) {
    const u64 n = (u64)W.n * (u64)W.k;
    u64 first = n;
    DLLM__TRY(scratch.fit(sizeof first, "the weight check"));
    DLLM__CUDA(cudaMemcpyAsync(scratch.ptr, &first, sizeof first, cudaMemcpyHostToDevice, stream));
    DLLM__TRY(k.find_nonfinite_bf16.launch({dim3(1024), dim3(256)}, stream, W.data.ptr, n, scratch.ptr));
    DLLM__CUDA(cudaMemcpyAsync(&first, scratch.ptr, sizeof first, cudaMemcpyDeviceToHost, stream));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    for (const dllm__tensor *t : parts) {
        if (first < (u64)t->numel) {
            const int64_t cols = t->shape.size() > 1 ? t->shape[1] : 1;
            return dllm__fail(
                DLLM_ERR_FORMAT,
                "tensor %s in %s holds a non-finite value (NaN or infinity) at [%lld, %lld]: the checkpoint is damaged",
                t->name.c_str(), t->file ? t->file->c_str() : "?", (long long)(first / (u64)cols),
                (long long)(first % (u64)cols));
        }
        first -= std::min(first, (u64)t->numel);
    }
    return DLLM_OK;
}

/* The same for the fp32 vectors (norm gains, biases), on the host: they are small. */
static dllm_status dllm__check_finite(const std::vector<float> &v, const char *what, size_t layer) {
    for (size_t i = 0; i < v.size(); i++)
        if (!std::isfinite(v[i]))
            return dllm__fail(
                DLLM_ERR_FORMAT,
                "the %s of layer %zu holds a non-finite value (NaN or infinity) at [%zu]: the checkpoint is damaged",
                what, layer, i);
    return DLLM_OK;
}

/* [SoloQ] A rotation's arrays on the device. */
static dllm_status dllm__rotation_upload(const dllm__rotation &r, dllm__rotation_dev &out) {
    out.b = r.b, out.k = r.k;
    out.norm = r.b > 1 ? (float)(1.0 / sqrt((double)r.b)) : 1.0f;
    auto put = [](dllm__dbuf &dst, const void *src, size_t bytes) -> dllm_status {
        if (!bytes) return DLLM_OK;
        DLLM__TRY(dst.fit(bytes, "SoloQ rotations"));
        DLLM__CUDA(cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice));
        return DLLM_OK;
    };
    DLLM__TRY(put(out.perm, r.perm.data(), r.perm.size() * 4));
    DLLM__TRY(put(out.signs, r.sign_bits.data(), r.sign_bits.size()));
    return put(out.mixer, r.mixer.data(), r.mixer.size() * 4);
}

/* [quantised checkpoints] A stored SoloQ linear (dllm_model::soloq: checked at load) as a DLLM__W_Q4 weight. rot: a
 * rotation the linears of one site share (a MoE layer's experts: one copy on the device, not one an expert), uploaded
 * by the first of them; null: its own. */
static dllm_status dllm__upload_q4(dllm__linear &W, const dllm__soloq_linear &stored,
                                   std::shared_ptr<dllm__rotation_dev> *rot_shared = nullptr) {
    const dllm__q4_rows &q = stored.w;
    auto put = [](dllm__dbuf &dst, const void *src, size_t bytes) -> dllm_status {
        DLLM__TRY(dst.fit(bytes, "SoloQ weights"));
        DLLM__CUDA(cudaMemcpy(dst.ptr, src, bytes, cudaMemcpyHostToDevice));
        return DLLM_OK;
    };
    std::unique_ptr<dllm__q4_site> site(new dllm__q4_site);
    site->format = q.format;
    std::shared_ptr<dllm__rotation_dev> rot = rot_shared ? *rot_shared : nullptr;
    if (!rot) {
        rot = std::make_shared<dllm__rotation_dev>();
        DLLM__TRY(dllm__rotation_upload(*stored.rot, *rot));
        if (rot_shared) *rot_shared = rot;
    }
    site->rot = rot;
    if (!q.block_scales.empty()) DLLM__TRY(put(site->block_scales, q.block_scales.data(), q.block_scales.size()));
    DLLM__TRY(put(W.data, q.codes.data(), q.codes.size()));
    DLLM__TRY(put(W.scale, q.row_scale.data(), q.row_scale.size() * 4));
    W.format = DLLM__W_Q4, W.n = q.rows, W.k = q.cols;
    W.q4 = std::move(site);
    return DLLM_OK;
}

/* Where a device copy's weights come from, a layer at a time: the checkpoint (BF16 with the projections fused, each
 * checked for non-finite values; a quantised checkpoint's linears as they are stored) or, for dllm_model_load_random,
 * the device's generator. dllm__gpu_weights_build quantises each layer before it asks for the next, so the device never
 * holds more than one layer in BF16 beside the quantised ones. */
struct dllm__weights_source {
    const dllm_model &m;
    const dllm__rowwise_kernels &k;
    cudaStream_t stream;
    dllm__dbuf scratch;  // the non-finite check's result
    uint64_t seed;       // random: the next tensor's

    dllm__weights_source(const dllm_model &model, const dllm__rowwise_kernels &kernels, cudaStream_t s)
        : m(model), k(kernels), stream(s), seed(model.random_seed) {}
    size_t n_layers() const { return m.random_weights ? (size_t)m.cfg.n_layer : m.layers.size(); }
    dllm_status layer(size_t l, dllm__gpu_layer &G) {
        return m.random_weights ? random_layer(l, G) : upload_layer(l, G);
    }
    /* The embedding table, the LM head and the final norm. */
    dllm_status rest(dllm__gpu_weights &w) { return m.random_weights ? random_rest(w) : upload_rest(w); }

  private:
    dllm_status upload(dllm__linear &W, std::initializer_list<const dllm__tensor *> parts, const char *what) {
        DLLM__TRY(dllm__upload_rows(W, parts, what));
        return dllm__check_finite(W, parts, k, stream, scratch);
    }
    dllm_status upload_layer(size_t l, dllm__gpu_layer &G);
    dllm_status upload_rest(dllm__gpu_weights &w);
    dllm_status random_layer(size_t l, dllm__gpu_layer &G);
    dllm_status random_rest(dllm__gpu_weights &w);
    dllm_status fill_bf16(dllm__dbuf &b, size_t n, float std_dev, const char *what) {
        DLLM__TRY(b.fit(n * 2, what));
        return k.fill_random_bf16.launch({dim3(1024), dim3(256)}, stream, b.ptr, n, seed++, std_dev, 0);
    }
    dllm_status fill_linear(dllm__linear &W, int n, int kk, float std_dev, const char *what) {
        W.format = DLLM__W_BF16, W.n = n, W.k = kk;
        return fill_bf16(W.data, (size_t)n * kk, std_dev, what);
    }
};

dllm_status dllm__weights_source::upload_layer(size_t l, dllm__gpu_layer &G) {
    const dllm__layer_weights &L = m.layers[l];
    if (m.soloq) {
        const dllm__soloq_layer &S = *m.soloq->layers[l];
        DLLM__TRY(dllm__upload_q4(G.qkv, S.lin[DLLM__SOLOQ_QKV]));
        DLLM__TRY(dllm__upload_q4(G.o, S.lin[DLLM__SOLOQ_O]));
        const bool moe = dllm__is_moe_layer(m.cfg, l);
        if (moe && m.cfg.n_ff_shared > 0) {  // [MoE] GU and DOWN hold the shared expert
            DLLM__TRY(dllm__upload_q4(G.shared_gu, S.lin[DLLM__SOLOQ_GU]));
            DLLM__TRY(dllm__upload_q4(G.shared_down, S.lin[DLLM__SOLOQ_DOWN]));
        } else if (!moe) {
            DLLM__TRY(dllm__upload_q4(G.gu, S.lin[DLLM__SOLOQ_GU]));
            DLLM__TRY(dllm__upload_q4(G.down, S.lin[DLLM__SOLOQ_DOWN]));
        }
        std::shared_ptr<dllm__rotation_dev> gu_rot, down_rot;  // every expert's gate|up, down: one site each
        G.expert_gu.resize(S.expert_gu.size()), G.expert_down.resize(S.expert_down.size());
        for (size_t e = 0; e < S.expert_gu.size(); e++) {
            DLLM__TRY(dllm__upload_q4(G.expert_gu[e], S.expert_gu[e], &gu_rot));
            DLLM__TRY(dllm__upload_q4(G.expert_down[e], S.expert_down[e], &down_rot));
        }
    } else {
        if (L.wqkv)  // LLaDA2's fused projection
            DLLM__TRY(upload(G.qkv, {L.wqkv}, "attention weights"));
        else
            DLLM__TRY(upload(G.qkv, {L.wq, L.wk, L.wv}, "attention weights"));
        DLLM__TRY(upload(G.o, {L.wo}, "attention weights"));
        if (L.gate) {  // null in a MoE layer
            DLLM__TRY(upload(G.gu, {L.gate, L.up}, "MLP weights"));
            DLLM__TRY(upload(G.down, {L.down}, "MLP weights"));
        }
    }
    if (L.router) {  // [MoE] LLaDA2's router (never quantised); its experts below in BF16 (quantised later)
        DLLM__TRY(upload(G.router, {L.router}, "the MoE router"));
        DLLM__TRY(dllm__check_finite(L.expert_bias, "expert bias", l));
        DLLM__TRY(dllm__upload_f32(G.expert_bias, L.expert_bias, "the MoE router"));
    }
    if (L.router && !m.soloq) {
        G.expert_gu.resize(L.expert_gate.size());
        G.expert_down.resize(L.expert_gate.size());
        for (size_t e = 0; e < L.expert_gate.size(); e++) {
            DLLM__TRY(upload(G.expert_gu[e], {L.expert_gate[e], L.expert_up[e]}, "MoE expert weights"));
            DLLM__TRY(upload(G.expert_down[e], {L.expert_down[e]}, "MoE expert weights"));
        }
        if (L.shared_gate) {
            DLLM__TRY(upload(G.shared_gu, {L.shared_gate, L.shared_up}, "MoE shared expert weights"));
            DLLM__TRY(upload(G.shared_down, {L.shared_down}, "MoE shared expert weights"));
        }
    }
    DLLM__TRY(dllm__check_finite(L.q_norm, "query norm", l));
    DLLM__TRY(dllm__check_finite(L.k_norm, "key norm", l));
    DLLM__TRY(dllm__upload_f32(G.q_norm, L.q_norm, "norm weights"));
    DLLM__TRY(dllm__upload_f32(G.k_norm, L.k_norm, "norm weights"));
    DLLM__TRY(dllm__check_finite(L.attn_norm, "attention norm", l));
    DLLM__TRY(dllm__check_finite(L.ffn_norm, "MLP norm", l));
    DLLM__TRY(dllm__upload_f32(G.attn_norm, L.attn_norm, "norm weights"));
    DLLM__TRY(dllm__upload_f32(G.ffn_norm, L.ffn_norm, "norm weights"));
    if (!L.bq.empty()) {
        std::vector<float> b(L.bq);
        b.insert(b.end(), L.bk.begin(), L.bk.end());
        b.insert(b.end(), L.bv.begin(), L.bv.end());
        DLLM__TRY(dllm__check_finite(b, "Q/K/V bias", l));
        DLLM__TRY(dllm__upload_f32(G.b_qkv, b, "attention biases"));
    }
    return DLLM_OK;
}

dllm_status dllm__weights_source::upload_rest(dllm__gpu_weights &w) {
    dllm__linear embed;
    DLLM__TRY(upload(embed, {m.embed}, "the embedding table"));
    w.embed = std::move(embed.data);
    if (m.soloq && m.soloq->head)
        DLLM__TRY(dllm__upload_q4(w.head, m.soloq->head->lin[DLLM__SOLOQ_HEAD]));
    else if (m.head != m.embed)
        DLLM__TRY(upload(w.head, {m.head}, "the LM head"));
    DLLM__TRY(dllm__check_finite(m.final_norm, "final norm", m.layers.size()));
    return dllm__upload_f32(w.final_norm, m.final_norm, "norm weights");
}

/* Benchmark weights generated on the device (no file, no host copy) as the PyTorch reference draws them: normal with
 * std 0.02, the residual branches' output projections 0.02 / sqrt(2 L); norms 1. */
dllm_status dllm__weights_source::random_layer(size_t l, dllm__gpu_layer &G) {
    const dllm__config &c = m.cfg;
    const int d = c.n_embd, qkv = (c.n_head + 2 * c.n_head_kv) * c.head_dim, q = c.n_head * c.head_dim;
    auto ones = [&](dllm__dbuf &b, size_t n, float value, const char *what) {
        return dllm__upload_f32(b, std::vector<float>(n, value), what);
    };
    const float std_in = 0.02f, std_out = std_in / sqrtf(2.f * (float)c.n_layer);
    DLLM__TRY(fill_linear(G.qkv, qkv, d, std_in, "attention weights"));
    DLLM__TRY(fill_linear(G.o, d, q, std_out, "attention weights"));
    if (c.family == DLLM_FAMILY_LLADA2) {  // [MoE] QK-norm, and past the dense layers the router and experts
        DLLM__TRY(ones(G.q_norm, (size_t)c.head_dim, 1.0f, "norm weights"));
        DLLM__TRY(ones(G.k_norm, (size_t)c.head_dim, 1.0f, "norm weights"));
    }
    if (c.family == DLLM_FAMILY_LLADA2 && (int)l >= c.n_dense_layers) {
        DLLM__TRY(fill_linear(G.router, c.n_expert, d, std_in, "the MoE router"));
        DLLM__TRY(ones(G.expert_bias, (size_t)c.n_expert, 0.0f, "the MoE router"));
        G.expert_gu.resize((size_t)c.n_expert), G.expert_down.resize((size_t)c.n_expert);
        for (int e = 0; e < c.n_expert; e++) {
            DLLM__TRY(fill_linear(G.expert_gu[(size_t)e], 2 * c.n_ff_expert, d, std_in, "MoE expert weights"));
            DLLM__TRY(fill_linear(G.expert_down[(size_t)e], d, c.n_ff_expert, std_out, "MoE expert weights"));
        }
        if (c.n_ff_shared > 0) {
            DLLM__TRY(fill_linear(G.shared_gu, 2 * c.n_ff_shared, d, std_in, "MoE shared expert weights"));
            DLLM__TRY(fill_linear(G.shared_down, d, c.n_ff_shared, std_out, "MoE shared expert weights"));
        }
    } else {
        DLLM__TRY(fill_linear(G.gu, 2 * c.n_ff, d, std_in, "MLP weights"));
        DLLM__TRY(fill_linear(G.down, d, c.n_ff, std_out, "MLP weights"));
    }
    DLLM__TRY(ones(G.attn_norm, (size_t)d, 1.0f, "norm weights"));
    DLLM__TRY(ones(G.ffn_norm, (size_t)d, 1.0f, "norm weights"));
    if (c.qkv_bias) DLLM__TRY(ones(G.b_qkv, (size_t)qkv, 0.0f, "attention biases"));
    return DLLM_OK;
}

dllm_status dllm__weights_source::random_rest(dllm__gpu_weights &w) {
    const dllm__config &c = m.cfg;
    DLLM__TRY(fill_bf16(w.embed, (size_t)c.n_vocab * c.n_embd, 0.02f, "the embedding table"));
    if (!c.tied_embeddings) DLLM__TRY(fill_linear(w.head, c.n_vocab, c.n_embd, 0.02f, "the LM head"));
    DLLM__TRY(dllm__upload_f32(w.final_norm, std::vector<float>((size_t)c.n_embd, 1.0f), "norm weights"));
    DLLM__CUDA(cudaStreamSynchronize(stream));
    return DLLM_OK;
}
